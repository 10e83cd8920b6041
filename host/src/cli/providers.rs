//! The providers `wasmproc run` gives a process component, from its flags.
//!
//! Each family is granted to every process of the run, and each is served by what its
//! flag set up, or, without the flag, by a stand-in that answers every command with a
//! denial naming the flag: so a guest that calls `kv.get` on a run without `--kv` learns
//! `denied: kv.get needs the key-value store: run with --kv DIR`, not that the command
//! does not exist.
//!
//! | family    | served by                          | granted by                        |
//! |-----------|------------------------------------|-----------------------------------|
//! | `http`    | outbound HTTP, to the allow-list   | `--allow-host PATTERN`            |
//! | `kv`      | a store in a directory             | `--kv DIR`                        |
//! | `fs`      | the granted directories            | `--dir`, `--dir-rw`               |
//! | `env`     | the granted variables              | `--env`                           |
//! | `time`, `random` | the host's clock and generator | always (as WASI's clocks are)  |
//! | `NAME`    | a provider component's `serve`     | `--provider NAME=FILE`            |
//!
//! Provider components run on a scheduler of their own, without the run's journal: they
//! are trusted services, not part of the durable history, and they get the same
//! providers as the run's processes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use wasmproc::handler::Request;
use wasmproc::provider::clock::{Random, Time};
use wasmproc::provider::env::Env;
use wasmproc::provider::fs::{Files, FilesSettings, Grant};
use wasmproc::provider::http::{HostPattern, Http, HttpSettings};
use wasmproc::provider::kv::{Kv, KvSettings};
use wasmproc::provider::{Provider, Served};
use wasmproc::scheduler::{Builder, SpawnOptions, Spawnable};
use wasmproc::wasm::{Program, Runtime};
use wasmproc::{Capabilities, Scheduler};

use super::input::read_app;
use super::inspect::declared::GrantedBy;
use super::{Exit, Failure, units};

/// The families every run grants, served by a flag's provider or by its stand-in.
pub(super) const FAMILIES: [&str; 6] = ["http", "kv", "fs", "env", "time", "random"];

/// The entry method a provider component serves requests from.
pub(super) const SERVE_ENTRY: &str = "serve";

/// Flags that give processes providers (beside `--dir`, `--dir-rw` and `--env`, which
/// WASI commands take too).
#[derive(Args, Debug)]
#[command(next_help_heading = "Providers")]
pub(super) struct ProviderArgs {
    /// Let processes make HTTP requests (`http.request`) to hosts that match PATTERN:
    /// `[SCHEME://]HOST[:PORT]`, HOST a name, `*.example.com`, `*` (any name) or an IP
    /// address; PORT a number or `*`. No scheme: http and https; no port: the scheme's.
    /// Names that resolve to loopback or private addresses are refused unless the
    /// pattern names the address (or `localhost`). Repeatable. [default: no host]
    #[arg(long = "allow-host", value_name = "PATTERN")]
    pub(super) allow_host: Vec<String>,
    /// The longest an HTTP request may take, body included.
    #[arg(long, value_name = "DURATION", default_value = units::duration_text(HttpSettings::default().timeout), value_parser = units::duration)]
    pub(super) http_timeout: Duration,
    /// The largest HTTP response body a process may receive, e.g. 8MiB.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(HttpSettings::default().max_response_body), value_parser = units::size)]
    pub(super) max_response: usize,
    /// Give processes a persistent key-value store (`kv.get`, `kv.put`, `kv.cas`, …) in
    /// DIR: the application's state, kept across runs. DIR is created private to the
    /// user (mode 700, files 600); an existing one others can read is made so, with a
    /// warning, and one others can write is refused.
    #[arg(long, value_name = "DIR")]
    pub(super) kv: Option<PathBuf>,
    /// The most keys the --kv store may hold.
    #[arg(long, value_name = "N", default_value_t = KvSettings::default().max_keys)]
    pub(super) kv_max_keys: u64,
    /// The most bytes (keys and values) the --kv store may hold, e.g. 256MiB.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(KvSettings::default().max_bytes as usize), value_parser = units::size)]
    pub(super) kv_max_bytes: usize,
    /// Serve the commands `NAME.*` with the provider component FILE: it runs from its
    /// `serve` entry on a scheduler of its own and answers each command as a request
    /// (see the `handler` world in wit/). Repeatable.
    #[arg(long = "provider", value_name = "NAME=FILE")]
    pub(super) providers: Vec<String>,
    /// Declare that the command NAME.COMMAND of a --provider component only reads: it
    /// changes nothing outside the process that yields it (a lookup), so carrying it out
    /// again is harmless. With --journal, a step whose commands all only read goes on
    /// before its record is synced instead of waiting for the disk; declaring a command
    /// that has an effect gives up the write-ahead guarantee for it. Repeatable.
    #[arg(long = "reads", value_name = "NAME.COMMAND", requires = "providers")]
    pub(super) reads: Vec<String>,
}

impl ProviderArgs {
    /// Whether any flag here was given: a WASI command takes none of them.
    pub(super) fn given(&self) -> Option<&'static str> {
        if !self.allow_host.is_empty() {
            Some("--allow-host")
        } else if self.kv.is_some() {
            Some("--kv")
        } else if !self.providers.is_empty() {
            Some("--provider")
        } else {
            None
        }
    }
}

/// The built-in providers of a run, ready to register on a scheduler.
#[derive(Clone)]
pub(super) struct Providers {
    http: Option<Http>,
    kv: Option<Kv>,
    /// The shards' store: the one the cluster's nodes share (`node --shared-kv`).
    shared_kv: Option<wasmproc::cluster::SharedKv>,
    files: Option<Files>,
    env: Option<Env>,
    /// The node (`wasmproc node --name`) they serve, if not a run: its denials say to
    /// start the node with the flag.
    node: Option<Arc<str>>,
    /// Served to the durable workflows of the node's shards, which move between nodes:
    /// no store of this machine's (`--kv`) is theirs.
    shards: bool,
}

impl Providers {
    /// Starts what the flags ask for: the HTTP client's thread, the store, the file
    /// thread.
    pub(super) fn start(
        args: &ProviderArgs,
        dirs: Vec<Grant>,
        env: Vec<(String, String)>,
    ) -> Result<Providers, Failure> {
        let http = if args.allow_host.is_empty() {
            None
        } else {
            let mut allow = Vec::with_capacity(args.allow_host.len());
            for pattern in &args.allow_host {
                allow.push(
                    HostPattern::parse(pattern)
                        .map_err(|e| Failure::new(Exit::Usage, format!("--allow-host `{pattern}`: {e}")))?,
                );
            }
            let settings = HttpSettings {
                allow,
                timeout: args.http_timeout,
                max_response_body: args.max_response,
                ..HttpSettings::default()
            };
            Some(Http::start(settings).map_err(|e| Failure::new(Exit::Host, format!("cannot start HTTP: {e:#}")))?)
        };
        let kv = match &args.kv {
            Some(dir) => {
                let settings = KvSettings {
                    max_keys: args.kv_max_keys,
                    max_bytes: args.kv_max_bytes as u64,
                    ..KvSettings::default()
                };
                Some(Kv::open(dir, settings).map_err(|e| Failure::new(Exit::Host, format!("--kv: {e:#}")))?)
            }
            None => None,
        };
        let files = if dirs.is_empty() {
            None
        } else {
            Some(Files::new(dirs, FilesSettings::default()).map_err(|e| Failure::new(Exit::Usage, format!("{e:#}")))?)
        };
        let env = (!env.is_empty()).then(|| Env::new(env));
        Ok(Providers { http, kv, shared_kv: None, files, env, node: None, shards: false })
    }

    /// The same, serving the runs of other hosts on node `name` of a cluster.
    pub(super) fn on_node(self, name: &str) -> Providers {
        Providers { node: Some(name.into()), ..self }
    }

    /// What the node's shards get: its HTTP hosts, directories and variables, and the
    /// store the cluster's nodes share if given, but not its own key-value store, which
    /// lives on this machine while a shard moves between nodes.
    pub(super) fn for_shards(&self, shared_kv: Option<wasmproc::cluster::SharedKv>) -> Providers {
        Providers { kv: None, shared_kv, shards: true, ..self.clone() }
    }

    /// Registers every family on `builder`: a flag's provider, or the stand-in that
    /// names the flag.
    pub(super) fn register(&self, builder: Builder) -> Builder {
        let missing = |family, needs| Missing { family, needs, node: self.node.clone() };
        let builder = match &self.http {
            Some(http) => builder.provider(http.clone()),
            None => builder.provider(missing("http", "an allowed host")),
        };
        let builder = match (&self.kv, &self.shared_kv) {
            (Some(kv), _) => builder.provider(kv.clone()),
            (None, Some(shared)) => builder.provider(shared.clone()),
            (None, None) if self.shards => builder.provider(Unshared),
            (None, None) => builder.provider(missing("kv", "the key-value store")),
        };
        let builder = match &self.files {
            Some(files) => builder.provider(files.clone()),
            None => builder.provider(missing("fs", "a directory")),
        };
        let builder = match &self.env {
            Some(env) => builder.provider(env.clone()),
            None => builder.provider(missing("env", "environment variables")),
        };
        builder.provider(Time).provider(Random)
    }
}

/// Answers every command of its family with a denial saying what it `needs` and the flag
/// that grants the command ([`GrantedBy`]: `--dir` for `fs.read`, `--dir-rw` for
/// `fs.write`).
struct Missing {
    family: &'static str,
    needs: &'static str,
    /// The node it stands in on, if not a run.
    node: Option<Arc<str>>,
}

impl Provider for Missing {
    fn family(&self) -> &str {
        self.family
    }

    fn handle(&self, request: Request<'_>) {
        let error = match &self.node {
            Some(node) => node_denial(request.name(), self.needs, node),
            None => denial(request.name(), self.needs),
        };
        request.complete(Err(error));
    }
}

/// The key-value family of the shards of a node started without `--shared-kv`: a store
/// of one machine's cannot follow a workflow to the next node.
struct Unshared;

impl Provider for Unshared {
    fn family(&self) -> &str {
        "kv"
    }

    fn handle(&self, request: Request<'_>) {
        let error = format!(
            "denied: `{}` needs the key-value store the cluster's nodes share: start the nodes with --shared-kv \
             (`wasmproc node --kv` serves the node's own runs only)",
            request.name()
        );
        request.complete(Err(error));
    }
}

/// What a run without the flag that grants `command` answers it.
fn denial(command: &str, needs: &str) -> String {
    format!("denied: `{command}` needs {needs}: run with {}", GrantedBy::of(command).flag())
}

/// The --dir and --dir-rw grants, each an existing directory.
pub(super) fn dir_grants(dir: &[String], dir_rw: &[String]) -> Result<Vec<Grant>, Failure> {
    let mut grants = Vec::new();
    for (specs, writable) in [(dir, false), (dir_rw, true)] {
        for spec in specs {
            let (host, guest) = spec.split_once("::").unwrap_or((spec, spec));
            if !Path::new(host).is_dir() {
                let flag = if writable { "--dir-rw" } else { "--dir" };
                return Err(Failure::new(Exit::Usage, format!("{flag} `{host}`: no such directory")));
            }
            grants.push(Grant { host: PathBuf::from(host), guest: guest.to_owned(), writable });
        }
    }
    Ok(grants)
}

/// The --env variables, NAME=VALUE or NAME passed through from the host's environment.
pub(super) fn env_vars(env: &[String]) -> Result<Vec<(String, String)>, Failure> {
    let mut vars = Vec::new();
    for spec in env {
        match spec.split_once('=') {
            Some((key, value)) if !key.is_empty() => vars.push((key.to_owned(), value.to_owned())),
            Some(_) => return Err(Failure::new(Exit::Usage, format!("--env `{spec}`: the name is empty"))),
            None => match std::env::var(spec) {
                Ok(value) => vars.push((spec.clone(), value)),
                Err(_) => {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!("--env `{spec}`: the host has no such variable (write NAME=VALUE to set one)"),
                    ));
                }
            },
        }
    }
    Ok(vars)
}

/// What node `node`, started without the flag that grants `command`, answers it.
fn node_denial(command: &str, needs: &str, node: &str) -> String {
    format!(
        "denied: `{command}` needs {needs}, which node `{node}` does not serve: start it with `wasmproc node {}`",
        GrantedBy::of(command).flag()
    )
}

/// Provider components, running on their scheduler.
pub(super) struct Services {
    scheduler: Scheduler,
    served: Vec<Served>,
}

impl Services {
    /// Loads each `--provider NAME=FILE` component and starts its `serve` process, on a
    /// scheduler of their own with the run's providers.
    pub(super) fn start(
        specs: &[String],
        reads: &[String],
        runtime: &Runtime,
        providers: &Providers,
        caps: &Capabilities,
        max_module_size: u64,
    ) -> Result<Option<Services>, Failure> {
        if specs.is_empty() {
            return Ok(None);
        }
        let mut components = Vec::with_capacity(specs.len());
        for spec in specs {
            let (name, file) = parse_spec(spec)?;
            let bytes = read_app(&file, max_module_size)?;
            let loaded = runtime
                .load_program_bytes(&bytes)
                .map_err(|e| Failure::new(Exit::BadModule, format!("cannot load `{}`: {e:#}", file.display())))?;
            let Program::Process(component) = loaded else {
                return Err(Failure::new(
                    Exit::BadModule,
                    format!("--provider {name}: `{}` is a WASI command, not a provider component", file.display()),
                ));
            };
            if !component.entries().iter().any(|e| e == SERVE_ENTRY) {
                return Err(Failure::new(
                    Exit::BadModule,
                    format!(
                        "--provider {name}: `{}` has no entry `{SERVE_ENTRY}` to serve requests from (its entries: {})",
                        file.display(),
                        component.entries().join(", ")
                    ),
                ));
            }
            components.push((name, component));
        }
        // Each declared read with the family it belongs to.
        let mut declared = Vec::with_capacity(reads.len());
        for read in reads {
            let usage = |why: String| Failure::new(Exit::Usage, format!("--reads `{read}`: {why}"));
            let Some((family, _)) = read.split_once('.').filter(|(_, command)| !command.is_empty()) else {
                return Err(usage("write NAME.COMMAND, a command of a --provider NAME=FILE".to_owned()));
            };
            if !components.iter().any(|(name, _)| name == family) {
                return Err(usage(format!("no --provider serves `{family}.*`")));
            }
            declared.push((family, read));
        }
        let mut builder = Scheduler::builder().workers(1).thread_name("wasmproc-provider").capabilities(caps.clone());
        builder = providers.register(builder);
        for (name, component) in &components {
            builder = builder.kind(name.clone(), component.clone());
        }
        let scheduler = builder
            .build()
            .map_err(|e| Failure::new(Exit::Host, format!("cannot start the providers' scheduler: {e:#}")))?;
        let mut served = Vec::with_capacity(components.len());
        for (name, _) in components {
            let process = scheduler
                .handle()
                .spawn(Spawnable::kind(name.clone()), SpawnOptions::new(SERVE_ENTRY))
                .map_err(|e| Failure::new(Exit::ProcessFailed, format!("--provider {name} could not start: {e}")))?;
            let reads: Vec<String> =
                declared.iter().filter(|(family, _)| *family == name).map(|(_, read)| (*read).clone()).collect();
            served.push(Served::new(name, scheduler.handle().clone(), process.pid()).reads(reads));
        }
        Ok(Some(Services { scheduler, served }))
    }

    /// Registers every served family on the run's builder.
    pub(super) fn register(&self, mut builder: Builder) -> Builder {
        for served in &self.served {
            builder = builder.provider(served.clone());
        }
        builder
    }

    /// Stops the provider processes, once the run's processes have ended.
    pub(super) fn stop(self, grace: Duration) {
        self.scheduler.stop(grace);
    }
}

/// `NAME=FILE`: a family name (one word, not a built-in family) and a file.
fn parse_spec(spec: &str) -> Result<(String, PathBuf), Failure> {
    let usage = |why: &str| Failure::new(Exit::Usage, format!("--provider `{spec}`: {why}"));
    let (name, file) = spec.split_once('=').ok_or_else(|| usage("write NAME=FILE, e.g. inventory=inventory.wasm"))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(usage("NAME is one word of letters, digits, `-` and `_`: the commands it serves are NAME.*"));
    }
    if FAMILIES.contains(&name) || Capabilities::BUILTIN.contains(&name) {
        return Err(usage(&format!("`{name}` is a built-in family or command")));
    }
    if file.is_empty() {
        return Err(usage("FILE is empty"));
    }
    Ok((name.to_owned(), PathBuf::from(file)))
}

#[cfg(test)]
mod tests {
    use super::denial;

    #[test]
    fn a_denial_names_the_flag_that_grants_the_very_command() {
        assert_eq!(denial("fs.read", "a directory"), "denied: `fs.read` needs a directory: run with --dir HOST::GUEST");
        assert_eq!(
            denial("fs.write", "a directory"),
            "denied: `fs.write` needs a directory: run with --dir-rw HOST::GUEST"
        );
        assert_eq!(
            denial("kv.get", "the key-value store"),
            "denied: `kv.get` needs the key-value store: run with --kv DIR"
        );
    }
}
