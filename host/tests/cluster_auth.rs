//! The cluster against someone who reaches its NATS server: without credentials, with a
//! client's, or with none but the server open and frames recorded; replays, forged
//! announcements, floods of junk, and a node that would start authenticating nothing.
//! Against a real `nats-server`: open, or started with the README's configuration
//! (`docs/cluster/`: users with subject permissions, TLS with certificates made for the
//! test).
//!
//! Every wait is bounded; nothing asserts on timing.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{sha256, wasmproc};
use futures_util::StreamExt as _;
use parking_lot::Mutex;
use wasmproc::cluster::{Client, Cluster, ClusterConfig, Placement};
use wasmproc::{Events, Payload, Port, Process, Scheduler, Status, StepOutput};
use wasmproc_tests::Killed;
use wasmproc_tests::nats::{CLIENT_INBOX, CLIENT_PASSWORD, NODE_PASSWORD, Node, Secured, Server, kind};

const SECRET: &str = "test-secret";
/// The bound of every wait in these tests.
const PATIENCE: Duration = Duration::from_secs(60);

/// Counts its starts in `STARTS` (by the first input, a counter's index), then waits
/// for a message and completes with it.
struct Counted(usize);

static STARTS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

impl Process for Counted {
    fn init(&mut self, _: Port, _: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        self.0 = input.first().and_then(Payload::to_u64).unwrap_or(0) as usize;
        STARTS[self.0].fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            if let wasmproc::Event::Message { body, .. } = event {
                out.complete(Ok(body));
                return Ok(());
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// A node in this process with the kind `counted`.
fn node(config: ClusterConfig, name: &str) -> Node {
    let config = config.name(name).placement(Placement::Local);
    Node::join(config, Scheduler::builder().workers(1).kind("counted", kind(|| Counted(0))))
}

/// Waits until `what` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A raw NATS connection: records what it hears and publishes what it is given, as
/// someone with no part in the cluster would.
struct Tap {
    runtime: tokio::runtime::Runtime,
    client: async_nats::Client,
    heard: Arc<Mutex<Vec<async_nats::Message>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Tap {
    /// Connects to `url` (with `ca` for TLS, as `user`) and listens on `subjects`.
    fn connect(url: &str, ca: Option<&std::path::Path>, user: Option<(&str, &str)>, subjects: &[&str]) -> Tap {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let errors = Arc::new(Mutex::new(Vec::new()));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let client = runtime.block_on(async {
            let sink = errors.clone();
            let mut options = async_nats::ConnectOptions::new().event_callback(move |event| {
                let sink = sink.clone();
                async move {
                    if let async_nats::Event::ServerError(error) = event {
                        sink.lock().push(error.to_string());
                    }
                }
            });
            if let Some(ca) = ca {
                options = options.add_root_certificates(ca.to_owned()).require_tls(true);
            }
            if let Some((user, password)) = user {
                options = options.user_and_password(user.to_owned(), password.to_owned());
            }
            options.connect(url).await.expect("the tap connects")
        });
        for subject in subjects {
            let mut subscription = runtime.block_on(client.subscribe(subject.to_string())).expect("subscribes");
            let heard = heard.clone();
            runtime.spawn(async move {
                while let Some(message) = subscription.next().await {
                    heard.lock().push(message);
                }
            });
        }
        runtime.block_on(client.flush()).expect("flushes");
        Tap { runtime, client, heard, errors }
    }

    /// Lets the tap's tasks take what arrived.
    fn settle(&self) {
        self.runtime.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
    }

    /// What it heard on subjects starting with `prefix`.
    fn heard(&self, prefix: &str) -> Vec<async_nats::Message> {
        self.settle();
        self.heard.lock().iter().filter(|m| m.subject.as_str().starts_with(prefix)).cloned().collect()
    }

    /// Publishes each of `messages` again, as it was (subject, reply subject, bytes).
    fn replay(&self, messages: &[async_nats::Message]) {
        self.runtime.block_on(async {
            for message in messages {
                let payload = message.payload.clone();
                let subject = message.subject.clone();
                match &message.reply {
                    Some(reply) => self.client.publish_with_reply(subject, reply.clone(), payload).await,
                    None => self.client.publish(subject, payload).await,
                }
                .expect("publishes");
            }
            self.client.flush().await.expect("flushes");
        });
    }

    /// Publishes `payload` on `subject`.
    fn publish(&self, subject: &str, payload: Vec<u8>) {
        self.runtime.block_on(async {
            self.client.publish(subject.to_owned(), payload.into()).await.expect("publishes");
        });
    }

    fn flush(&self) {
        self.runtime.block_on(self.client.flush()).expect("flushes");
    }

    /// The server's errors to this connection so far (permissions violations).
    fn errors(&self) -> Vec<String> {
        self.settle();
        self.errors.lock().clone()
    }
}

/// A NATS user without the secret records a client's run and a node's spawn on
/// another node, and publishes every frame again, three times, while the client is
/// there and after it has left: no process starts again, and each copy is counted.
#[test]
fn replayed_frames_start_nothing_again() {
    let server = Server::start().expect("a nats-server on loopback");
    let open = |name: &str| node(ClusterConfig::new(server.url()).secret(SECRET), name);
    let tap = Tap::connect(&server.url(), None, None, &["wasmproc.>"]);
    let a = open("replay-a");
    let b = open("replay-b");
    a.wait_for(2);
    b.wait_for(2);

    // A client's run on `a`, and a spawn from `a`'s embedder on `b`.
    let client = Client::connect(ClusterConfig::new(server.url()).secret(SECRET)).expect("a client connects");
    let run = client
        .spawn(
            Some("replay-a"),
            Some("counted".into()),
            None,
            wasmproc::scheduler::SpawnOptions::new("main").input(vec![Payload::u64(1)]),
        )
        .expect("spawns");
    let linked = a
        .cluster
        .spawn(
            Some("replay-b"),
            Some("counted".into()),
            None,
            wasmproc::scheduler::SpawnOptions::new("main").input(vec![Payload::u64(2)]),
        )
        .expect("spawns");
    wait_until("both started", || run.pid().is_some() && linked.pid().is_some());
    assert_eq!((STARTS[1].load(Ordering::SeqCst), STARTS[2].load(Ordering::SeqCst)), (1, 1));

    let runs = tap.heard("wasmproc.run.");
    let links = tap.heard("wasmproc.node.");
    assert!(runs.iter().any(|m| m.subject.as_str() != "wasmproc.run.hello"), "the tap heard the client's run");
    assert!(!links.is_empty(), "the tap heard the link from `a` to `b`");
    let repeated = |n: &Node| n.cluster.stats().frames_repeated + n.cluster.stats().frames_refused;
    let before = repeated(&a) + repeated(&b);
    for _ in 0..3 {
        tap.replay(&runs);
        tap.replay(&links);
    }
    // The copies are taken and refused: the counts say so.
    wait_until("the copies counted", || repeated(&a) + repeated(&b) >= before + 3);

    // Both processes end; the client leaves; the copies go again.
    a.scheduler.handle().send(run.pid().unwrap(), "t", Payload::u64(7)).expect("sends");
    a.scheduler.handle().send(linked.pid().unwrap(), "t", Payload::u64(8)).expect("sends");
    assert_eq!(run.join_timeout(PATIENCE), Some(Ok(Payload::u64(7))));
    assert_eq!(linked.join_timeout(PATIENCE), Some(Ok(Payload::u64(8))));
    client.leave();
    let before = repeated(&a) + repeated(&b);
    for _ in 0..3 {
        tap.replay(&runs);
        tap.replay(&links);
    }
    wait_until("the copies counted", || repeated(&a) + repeated(&b) >= before + 3);
    // What a copy could have started would have by the time the next heartbeat went.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(STARTS[1].load(Ordering::SeqCst), 1, "the client's run started again");
    assert_eq!(STARTS[2].load(Ordering::SeqCst), 1, "the spawn on `b` started again");
    assert_eq!(a.scheduler.handle().live() + b.scheduler.handle().live(), 0, "a process runs that nobody started");
}

/// The announcements of a node that left, published again (its heartbeats and
/// its goodbye), bring no ghost back: the others never list it, and a real node of that
/// name joins. A live node's own announcements published again (its goodbye among
/// them) do not evict it.
#[test]
fn replayed_announcements_bring_no_ghost_back_and_evict_no_one() {
    let server = Server::start().expect("a nats-server on loopback");
    let open = |name: &str| node(ClusterConfig::new(server.url()).secret(SECRET), name);
    let tap = Tap::connect(&server.url(), None, None, &["wasmproc.announce"]);
    let a = open("ghost-a");
    let ghost = open("ghost");
    a.wait_for(2);
    ghost.wait_for(2);
    std::thread::sleep(Duration::from_millis(1200));
    ghost.cluster.leave();
    wait_until("`ghost` gone", || a.cluster.nodes().len() == 1);
    let announced = tap.heard("wasmproc.announce");
    let ghostly: Vec<_> = announced
        .iter()
        .filter(|m| {
            String::from_utf8_lossy(&m.payload).contains("ghost")
                && !String::from_utf8_lossy(&m.payload).contains("ghost-a")
        })
        .cloned()
        .collect();
    assert!(ghostly.len() >= 3, "the tap heard the ghost's heartbeats: {}", ghostly.len());
    // Its heartbeats, without its goodbye (the last it sent), which would take back
    // what they brought.
    let heartbeats = &ghostly[..ghostly.len() - 1];

    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        tap.replay(heartbeats);
        assert_eq!(a.cluster.nodes().len(), 1, "a ghost is listed: {:?}", a.cluster.nodes());
        std::thread::sleep(Duration::from_millis(50));
    }
    let listed = wasmproc::cluster::list(ClusterConfig::new(server.url()).secret(SECRET)).expect("lists");
    assert!(listed.iter().all(|n| n.name != "ghost"), "{listed:?}");

    // A real node of that name joins, and is seen.
    let real = open("ghost");
    real.wait_for(2);
    a.wait_for(2);

    // `a`'s own announcements, its goodbye-free heartbeats and all, published again
    // evict nothing; neither does `real`'s.
    let everything = tap.heard("wasmproc.announce");
    for _ in 0..3 {
        tap.replay(&everything);
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(a.cluster.nodes().len(), 2, "{:?}", a.cluster.nodes());
    assert_eq!(real.cluster.nodes().len(), 2, "{:?}", real.cluster.nodes());
    assert!(a.cluster.stats().frames_repeated > 0, "the copies were counted: {:?}", a.cluster.stats());
}

/// A node with no authentication at all does not start unless `--insecure`,
/// which warns once; the library refuses the same.
#[test]
fn a_node_with_no_authentication_refuses_to_start_unless_insecure() {
    let server = Server::start().expect("a nats-server on loopback");
    let out = wasmproc().args(["node", "--cluster", &server.url(), "--name", "open"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no authentication at all") && stderr.contains("--insecure"), "{stderr}");

    let error = Cluster::join(ClusterConfig::new(server.url()).name("open")).unwrap_err();
    assert!(format!("{error:#}").contains("no authentication at all"), "{error:#}");

    let log = std::env::temp_dir().join(format!("wasmproc-insecure-{}.log", std::process::id()));
    let child = wasmproc()
        .args(["node", "--cluster", &server.url(), "--name", "open", "--insecure", "--workers", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("a log file"))
        .spawn()
        .expect("starts");
    let _node = Killed(child);
    let config = || ClusterConfig::new(server.url());
    wait_until("the open node answers", || wasmproc::cluster::list(config()).is_ok_and(|nodes| nodes.len() == 1));
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert_eq!(stderr.matches("WARNING").count(), 1, "{stderr}");
    assert!(stderr.contains("--insecure"), "{stderr}");
}

/// The README's server configuration, as it is: a client without credentials, or with
/// a wrong password, is refused by the server (`authentication failed`); a node with
/// the node's credentials and no secret joins; a client with the client's credentials
/// runs on it but can neither listen to nor publish on the nodes' subjects, nor read
/// another client's answers, nor act as a node.
#[test]
fn the_readme_server_configuration_keeps_clients_to_clients_rights() {
    let secured = Secured::start().expect("a secured nats-server");
    let a = node(secured.node(), "perm-a");
    let b = node(secured.node(), "perm-b");
    a.wait_for(2);
    b.wait_for(2);

    // No credentials, a wrong password: refused by the server.
    let anonymous = ClusterConfig::new(secured.server.url()).tls_ca(&secured.ca);
    let error = Client::connect(anonymous.clone()).unwrap_err();
    assert!(format!("{error:#}").contains("authentication failed"), "{error:#}");
    let error = Cluster::join(anonymous.insecure(true).name("anonymous")).unwrap_err();
    assert!(format!("{error:#}").contains("authentication failed"), "{error:#}");
    let wrong = ClusterConfig::new(secured.server.url_as("node", "wrong")).tls_ca(&secured.ca);
    let error = Cluster::join(wrong.name("wrong")).unwrap_err();
    assert!(format!("{error:#}").contains("authentication failed"), "{error:#}");
    // Without TLS to a server that requires it: no connection.
    let plain = ClusterConfig::new(secured.server.url_as("node", NODE_PASSWORD).replacen("tls://", "nats://", 1));
    assert!(Cluster::join(plain.name("plain")).is_err());

    // A client runs a job.
    let client = Client::connect(secured.client()).expect("a client connects");
    assert_eq!(client.nodes().len(), 2, "{:?}", client.nodes());
    let run = client
        .spawn(
            Some("perm-b"),
            Some("counted".into()),
            None,
            wasmproc::scheduler::SpawnOptions::new("main").input(vec![Payload::u64(3)]),
        )
        .expect("spawns");
    wait_until("the run started", || run.pid().is_some());
    let pid = run.pid().unwrap();

    // With the client's rights, listening on the nodes' subjects and others' answers,
    // and publishing as a node, are refused by the server.
    let tap = Tap::connect(
        &secured.server.url(),
        Some(&secured.ca),
        Some(("client", CLIENT_PASSWORD)),
        &["wasmproc.>", "_INBOX.>", "_INBOX_client.>"],
    );
    for subject in [
        format!("wasmproc.node.{}", pid.node()),
        "wasmproc.announce".to_owned(),
        "wasmproc.hello".to_owned(),
        format!("wasmproc.code.{}", pid.node()),
    ] {
        tap.publish(&subject, b"forged".to_vec());
    }
    tap.flush();
    let errors = tap.errors();
    for denied in [
        "Subscription to \"wasmproc.>\"",
        "Subscription to \"_INBOX.>\"",
        "Publish to \"wasmproc.announce\"",
        "Publish to \"wasmproc.hello\"",
    ] {
        assert!(
            errors.iter().any(|e| e.contains("Permissions Violation") && e.contains(denied)),
            "{denied}: {errors:?}"
        );
    }
    assert!(tap.heard("wasmproc.").is_empty(), "a client heard the nodes' subjects");

    // A node with a client's credentials hears no one and is heard by no one.
    let intruder = Cluster::join(secured.client().name("intruder"));
    std::thread::sleep(Duration::from_millis(1500));
    if let Ok(intruder) = &intruder {
        assert_eq!(intruder.nodes().len(), 1, "{:?}", intruder.nodes());
    }
    assert!(a.cluster.nodes().iter().all(|n| n.name != "intruder"), "{:?}", a.cluster.nodes());

    // The job is the client's to end, and runs as before.
    b.scheduler.handle().send(pid, "t", Payload::u64(9)).expect("sends");
    assert_eq!(run.join_timeout(PATIENCE), Some(Ok(Payload::u64(9))));
    assert_eq!(a.cluster.stats().nodes_lost + b.cluster.stats().nodes_lost, 0);
}

/// The same server with NKey users and TLS client certificates: the nodes join with
/// their seed files (`--cluster-nkey`), and the client certificate is taken.
#[test]
fn nodes_join_with_nkeys_over_tls() {
    let node_key = nkeys::KeyPair::new_user();
    let client_key = nkeys::KeyPair::new_user();
    let (node_pub, client_pub) = (node_key.public_key(), client_key.public_key());
    let secured = Secured::start_with(|dir| {
        let config = dir.join("nkeys.conf");
        let text = format!(
            "include ./permissions.conf\ntls {{\n  cert_file: \"server-cert.pem\"\n  key_file: \"server-key.pem\"\n  ca_file: \"ca.pem\"\n  verify: true\n}}\n\
             authorization {{\n  users: [\n    {{ nkey: {node_pub}, permissions: $WASMPROC_NODE }}\n    {{ nkey: {client_pub}, permissions: $WASMPROC_CLIENT }}\n  ]\n}}\n"
        );
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        Ok(Some(config))
    })
    .expect("a secured nats-server");
    let seed = |key: &nkeys::KeyPair, name: &str| {
        let path = secured.dir().join(name);
        std::fs::write(&path, format!("{}\n", key.seed().expect("a seed"))).expect("writes");
        path
    };
    let (node_seed, client_seed) = (seed(&node_key, "node.nk"), seed(&client_key, "client.nk"));
    let (cert, key) = secured.client_cert.clone();
    let config = |seed: &std::path::Path| {
        ClusterConfig::new(secured.server.url()).tls_ca(&secured.ca).tls_client(&cert, &key).nkey(seed)
    };
    let a = node(config(&node_seed), "nk-a");
    let b = node(config(&node_seed), "nk-b");
    a.wait_for(2);
    b.wait_for(2);
    let client = Client::connect(config(&client_seed).inbox(CLIENT_INBOX)).expect("a client connects");
    assert_eq!(client.nodes().len(), 2);
    // Without the client certificate the server's TLS refuses the connection.
    let bare = ClusterConfig::new(secured.server.url()).tls_ca(&secured.ca).nkey(&node_seed).name("bare");
    assert!(Cluster::join(bare).is_err());
}

/// 20,000 junk frames and 300 frames of 512 KiB on a node's subject and the
/// announcements': the two nodes never declare each other lost, and the flooded `wasmproc
/// node` logs a line a heartbeat with a count and a sample, not a line a frame.
#[test]
fn a_flood_of_junk_costs_no_membership_and_few_log_lines() {
    let server = Server::start().expect("a nats-server on loopback");
    let log = std::env::temp_dir().join(format!("wasmproc-flood-{}.log", std::process::id()));
    let child = wasmproc()
        .args(["node", "--cluster", &server.url(), "--name", "flooded", "--cluster-secret", SECRET, "--workers", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("a log file"))
        .spawn()
        .expect("starts");
    let _flooded = Killed(child);
    let b = node(ClusterConfig::new(server.url()).secret(SECRET), "witness");
    b.wait_for(2);
    let id = b.cluster.nodes().iter().find(|n| n.name == "flooded").expect("listed").id;
    let tap = Tap::connect(&server.url(), None, None, &[]);
    let subject = format!("wasmproc.node.{id}");
    for i in 0..20_000u32 {
        let junk = format!("junk {i}").into_bytes();
        tap.publish(if i % 2 == 0 { &subject } else { "wasmproc.announce" }, junk);
    }
    // Frames that look like announcements of node 4095 down to their kind, so each
    // costs the nodes a MAC over half a megabyte before it is refused.
    let mut big = vec![0u8; 512 << 10];
    big[0] = 5;
    big[33..37].copy_from_slice(&[0xff, 0x1f, 0x01, 0x01]);
    for i in 0..300 {
        tap.publish(if i % 2 == 0 { &subject } else { "wasmproc.announce" }, big.clone());
        if i % 50 == 0 {
            tap.flush();
        }
    }
    tap.flush();
    // Past the loss deadline twice over, the membership holds.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(b.cluster.stats().nodes_lost, 0, "{:?}", b.cluster.stats());
    assert!(b.cluster.nodes().iter().any(|n| n.name == "flooded"), "{:?}", b.cluster.nodes());
    assert!(b.cluster.stats().frames_refused >= 5_000, "{:?}", b.cluster.stats());
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let lines = stderr.lines().filter(|l| l.contains("refused")).count();
    assert!((1..=40).contains(&lines), "{lines} lines of refusals:\n{stderr}");
    assert!(stderr.contains("count="), "{stderr}");
}

/// A client terminates only what its own run spawned. Another client's
/// termination of the same pid is refused by the node, and the process runs on.
#[test]
fn a_client_terminates_only_what_its_run_spawned() {
    let server = Server::start().expect("a nats-server on loopback");
    let a = node(ClusterConfig::new(server.url()).secret(SECRET), "roles");
    a.wait_for(1);
    let config = || ClusterConfig::new(server.url()).secret(SECRET);
    let spawn = |client: &Client, n: u64| {
        let options = wasmproc::scheduler::SpawnOptions::new("main").input(vec![Payload::u64(n)]);
        let process = client.spawn(Some("roles"), Some("counted".into()), None, options).expect("spawns");
        wait_until("the run started", || process.pid().is_some());
        process
    };
    let (alice, mallory) = (Client::connect(config()).expect("connects"), Client::connect(config()).expect("connects"));
    let victim = spawn(&alice, 4);
    let own = spawn(&mallory, 5);
    mallory.terminate(victim.pid().unwrap());
    // Mallory's own, terminated after: once it has ended, so has anything before it.
    mallory.terminate(own.pid().unwrap());
    assert_eq!(own.join_timeout(PATIENCE), Some(Err(wasmproc::ExitReason::Terminated)));
    assert_eq!(victim.join_timeout(Duration::from_millis(300)), None, "another client's termination ended it");
    alice.terminate(victim.pid().unwrap());
    assert_eq!(victim.join_timeout(PATIENCE), Some(Err(wasmproc::ExitReason::Terminated)));
}

/// A node grants what the CLI grants: a run's `terminate` of a process not its own child
/// (its own `--allow terminate`) is denied on a node started without `--allow terminate`,
/// and works on one started with it; a process's own children it may always end.
#[test]
fn a_node_denies_terminate_unless_started_with_it() {
    let server = Server::start().expect("a nats-server on loopback");
    let run = |allow: &[&str]| {
        let name = format!("term-{}", allow.len());
        let node = wasmproc()
            .args(["node", "--cluster", &server.url(), "--name", &name, "--cluster-secret", SECRET, "--workers", "1"])
            .args(allow)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let node = Killed(node);
        let config = ClusterConfig::new(server.url()).secret(SECRET);
        wait_until("the node answers", || {
            wasmproc::cluster::list(config.clone()).is_ok_and(|nodes| nodes.iter().any(|n| n.name == name && n.accepts))
        });
        let out = wasmproc()
            .args(["cluster", "run", wasmproc_tests::guests::SDK_TOUR, "--method", "sibling_terminates"])
            .args(["--allow", "terminate", "--cluster", &server.url(), "--cluster-secret", SECRET])
            .output()
            .expect("runs");
        drop(node);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("permission denied") && stdout.contains("terminate"), "{stdout}");
    let (code, stdout, stderr) = run(&["--allow", "terminate"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("\"terminated\"") && !stdout.contains("permission denied"), "{stdout}");
}

/// A component fetched by hash for one run is spawnable by hash only within
/// it: a client that does not hold the bytes cannot spawn it by its (public) hash, and
/// a guest of another run cannot spawn it as a kind; a node with components shared
/// lets the guest.
#[test]
fn a_component_is_spawnable_by_hash_only_within_the_run_that_brought_it() {
    let server = Server::start().expect("a nats-server on loopback");
    let runtime = wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default()).expect("a runtime");
    let scoped = |name: &str, shared: bool| {
        let config = ClusterConfig::new(server.url()).secret(SECRET).name(name).share_components(shared);
        Node::join_loading(config, Scheduler::builder().workers(1), &runtime)
    };
    let config = || ClusterConfig::new(server.url()).secret(SECRET);
    let hostile = std::fs::read(wasmproc_tests::guests::HOSTILE).expect("the guest");
    let fan_out = std::fs::read(wasmproc_tests::guests::FAN_OUT).expect("the guest");
    let (hostile_hash, fan_out_hash) = (sha256(&hostile), sha256(&fan_out));
    for (name, shared) in [("scoped", false), ("shared", true)] {
        let node = scoped(name, shared);
        node.wait_for(1);
        // Alice brings the hostile guest: her run spawns it by hash.
        let alice = Client::connect(config()).expect("connects");
        alice.offer(hostile_hash.clone(), hostile.clone());
        let options = wasmproc::scheduler::SpawnOptions::new("memory-bomb");
        let run = alice.spawn(Some(name), None, Some(hostile_hash.clone()), options).expect("spawns");
        let error = run.join_timeout(PATIENCE).expect("ends").expect_err("runs out of memory").to_string();
        assert!(error.contains("memory limit exceeded"), "{error}");

        // Mallory, without the bytes, asks for it by hash: refused, unless shared.
        let mallory = Client::connect(config()).expect("connects");
        let options = wasmproc::scheduler::SpawnOptions::new("memory-bomb");
        let run = mallory.spawn(Some(name), None, Some(hostile_hash.clone()), options).expect("spawns");
        let error = run.join_timeout(PATIENCE).expect("ends").expect_err("fails").to_string();
        let expected = if shared { "memory limit exceeded" } else { "does not hold component" };
        assert!(error.contains(expected), "{name}: {error}");

        // Mallory's own program spawns it as a kind: refused unless shared.
        mallory.offer(fan_out_hash.clone(), fan_out.clone());
        let input = Payload::json(&(hostile_hash.as_str(), "memory-bomb", ())).unwrap();
        let options = wasmproc::scheduler::SpawnOptions::new("delegate").input(vec![input]);
        let run = mallory.spawn(Some(name), None, Some(fan_out_hash.clone()), options).expect("spawns");
        let error = run.join_timeout(PATIENCE).expect("ends").expect_err("fails").to_string();
        let expected = if shared { "memory limit exceeded" } else { "unknown process kind" };
        assert!(error.contains(expected), "{name}: {error}");
        node.cluster.leave();
    }
}

/// A client whose secret differs from the nodes' is told that authentication
/// failed, naming the nodes, not that no node takes spawns; a lost node is named.
#[test]
fn a_wrong_secret_says_authentication_failed_and_lost_nodes_are_named() {
    let server = Server::start().expect("a nats-server on loopback");
    let a = node(ClusterConfig::new(server.url()).secret(SECRET), "named-a");
    a.wait_for(1);
    let out = wasmproc()
        .args(["run", wasmproc_tests::guests::FAN_OUT, "--input", "3"])
        .args(["--cluster", &server.url(), "--cluster-secret", "wrong"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("authentication failed") && stderr.contains("`named-a`"), "{stderr}");

    let b = wasmproc()
        .args(["node", "--cluster", &server.url(), "--name", "named-b", "--cluster-secret", SECRET, "--workers", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let mut b = Killed(b);
    a.wait_for_accepting(2);
    let hostile = std::fs::read(wasmproc_tests::guests::HOSTILE).expect("the guest");
    let hash = sha256(&hostile);
    a.cluster.offer(hash.clone(), hostile);
    let process = a.cluster.spawn(Some("named-b"), None, Some(hash), "spin").expect("spawns");
    wait_until("started", || process.pid().is_some());
    // `b` goes without a word.
    b.0.kill().expect("SIGKILL");
    let _ = b.0.wait();
    let error = process.join_timeout(PATIENCE).expect("the loss is heard").expect_err("noconnection");
    assert_eq!(error, wasmproc::ExitReason::Noconnection("named-b".into()));
}

/// A NATS JWT (header, claims, ed25519 signature by `issuer`), as `nsc` writes them.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let iat = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let claims = serde_json::json!({
        "jti": format!("{subject}{iat}"), "iat": iat, "iss": issuer.public_key(), "name": name, "sub": subject,
        "nats": nats,
    });
    let claims = b64(claims.to_string().as_bytes());
    let signature = issuer.sign(format!("{header}.{claims}").as_bytes()).expect("signs");
    format!("{header}.{claims}.{}", b64(&signature))
}

/// A credentials file holding a user's JWT and seed.
fn creds(jwt: &str, user: &nkeys::KeyPair) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().expect("a seed")
    )
}

/// A server in operator mode (JWTs, as `nsc` sets one up): nodes join with a
/// credentials file (`--cluster-creds`) whose user has the node's rights, a client runs
/// with one of a client's rights, and a user the account did not sign is refused.
#[test]
fn nodes_and_clients_join_with_credentials_files() {
    let (operator, account) = (nkeys::KeyPair::new_operator(), nkeys::KeyPair::new_account());
    let operator_jwt =
        jwt(&operator, &operator.public_key(), "wasmproc", serde_json::json!({"type": "operator", "version": 2}));
    let limits = serde_json::json!({"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1});
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "cluster",
        serde_json::json!({"limits": limits, "type": "account", "version": 2}),
    );
    let user = |name: &str, signer: &nkeys::KeyPair, rights: serde_json::Value| {
        let key = nkeys::KeyPair::new_user();
        let mut nats = rights;
        nats["type"] = "user".into();
        nats["version"] = 2.into();
        nats["subs"] = (-1).into();
        nats["data"] = (-1).into();
        nats["payload"] = (-1).into();
        creds(&jwt(signer, &key.public_key(), name, nats), &key)
    };
    let node_rights = serde_json::json!({"pub": {"allow": [">"]}, "sub": {"allow": ["wasmproc.>", "_INBOX.>"]}});
    let client_rights = serde_json::json!({"pub": {"allow": ["wasmproc.run.>"]}, "sub": {"allow": ["_INBOX_client.>"]},
        "resp": {"max": 1, "ttl": 0}});
    let (node_creds, client_creds) =
        (user("node", &account, node_rights.clone()), user("client", &account, client_rights));
    let stranger_creds = user("stranger", &nkeys::KeyPair::new_account(), node_rights);
    let secured = Secured::start_with(|dir| {
        let config = dir.join("operator.conf");
        let text = format!(
            "tls {{\n  cert_file: \"server-cert.pem\"\n  key_file: \"server-key.pem\"\n}}\noperator: {operator_jwt}\n\
             resolver: MEMORY\nresolver_preload: {{\n  {}: {account_jwt}\n}}\n",
            account.public_key()
        );
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        Ok(Some(config))
    })
    .expect("a nats-server in operator mode");
    let file = |name: &str, text: &str| {
        let path = secured.dir().join(name);
        std::fs::write(&path, text).expect("writes");
        path
    };
    let (node_file, client_file, stranger_file) =
        (file("node.creds", &node_creds), file("client.creds", &client_creds), file("stranger.creds", &stranger_creds));
    let config = |creds: &std::path::Path| ClusterConfig::new(secured.server.url()).tls_ca(&secured.ca).creds(creds);
    let a = node(config(&node_file), "creds-a");
    a.wait_for(1);
    let client = Client::connect(config(&client_file).inbox(CLIENT_INBOX)).expect("a client connects");
    let options = wasmproc::scheduler::SpawnOptions::new("main").input(vec![Payload::u64(7)]);
    let run = client.spawn(Some("creds-a"), Some("counted".into()), None, options).expect("spawns");
    wait_until("the run started", || run.pid().is_some());
    a.scheduler.handle().send(run.pid().unwrap(), "t", Payload::u64(1)).expect("sends");
    assert_eq!(run.join_timeout(PATIENCE), Some(Ok(Payload::u64(1))));
    let error = Cluster::join(config(&stranger_file).name("stranger")).unwrap_err();
    assert!(format!("{error:#}").contains("authentication failed"), "{error:#}");
}
