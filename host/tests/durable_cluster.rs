//! Durable workflows outliving their node, with real processes: three `wasmproc node
//! --shards` on a cluster of three NATS servers with JetStream (streams of three
//! replicas), every connection authenticated as the repository's rights say
//! (`docs/cluster/permissions.conf`), workflows started and read by a client with a
//! client's rights. Nodes are SIGKILLed at random moments, frozen with SIGSTOP past
//! their leases, drained with SIGTERM; a NATS server is SIGKILLed.
//!
//! The workflow is `examples-wasm/durable`: timers, children, and a message to each
//! child every round whose answers it sums, so a message lost hangs it and one
//! delivered twice changes its result. Every workflow must end with the result of a run
//! that no one crashed. In the kill and freeze tests the children also post each answer
//! over HTTP to a server of the test's (`Recorder`) before they send it: a side effect
//! outside the journal, counted there by its idempotency key.
//!
//! Every wait is bounded; nothing asserts on timing.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use wasmproc_tests::guests::DURABLE;
use wasmproc_tests::nats::{CLIENT_INBOX, CLIENT_PASSWORD, JetStreamCluster, NODE_PASSWORD};
use wasmproc_tests::recorder::Recorder;

/// The `wasmproc` binary this package builds.
fn wasmproc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wasmproc"))
}

/// The shards of these clusters.
const SHARDS: &str = "6";
/// The leases' time to live: short, so that failovers come quickly.
const LEASE: &str = "3s";
/// The workflows' input: 3 children, 12 rounds (each with a sleep of 20 ms).
const INPUT: &str = "[3, 12]";
/// `INPUT` without its brackets, for inputs that add to it.
const ROUNDS: &str = "3, 12";
/// What the workers of one workflow of `INPUT` post, all together: each of the 3 posts
/// n² for each round n of 12.
const POSTED: u64 = 3 * (12 * 13 * 25) / 6;
/// How long a workflow may take to end, crashes included.
const PATIENCE: Duration = Duration::from_secs(120);

/// A cluster of three servers and up to three nodes, and the client's flags.
struct Durable {
    servers: JetStreamCluster,
    nodes: Vec<Option<Child>>,
    logs: PathBuf,
    /// Each node's restarts, for its log files' names.
    starts: Vec<u32>,
    /// More flags for every node.
    flags: Vec<String>,
}

impl Durable {
    fn start() -> Durable {
        Durable::start_with(&[])
    }

    fn start_with(flags: &[&str]) -> Durable {
        let servers = JetStreamCluster::start_secured(3).expect("a secured JetStream cluster starts");
        let logs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "durable-cluster-{}-{}",
            std::process::id(),
            servers.servers[0].url().replace(['/', ':'], "")
        ));
        std::fs::create_dir_all(&logs).expect("a directory for the nodes' logs");
        let flags = flags.iter().map(|flag| (*flag).to_owned()).collect();
        let mut durable = Durable { servers, nodes: vec![None, None, None], logs, starts: vec![0; 3], flags };
        for index in 0..3 {
            durable.start_node(index);
        }
        durable.wait_for_owners(3);
        durable
    }

    /// The URL of server `index` as user `user`.
    fn url(&self, index: usize, user: &str) -> String {
        let password = if user == "node" { NODE_PASSWORD } else { CLIENT_PASSWORD };
        self.servers.servers[index].url_as(user, password)
    }

    /// Starts node `index` (again), connected to server `index % 2`: the third server
    /// serves no node, so it can be killed without taking a node's connection.
    fn start_node(&mut self, index: usize) {
        self.starts[index] += 1;
        let log = self.logs.join(format!("node-{index}-{}.log", self.starts[index]));
        let log = std::fs::File::create(&log).expect("a node's log file");
        let child = wasmproc()
            .args(["node", "--name", &format!("n{index}-{}", self.starts[index]), "--shards", SHARDS])
            .args(["--lease", LEASE, "--replicas", "3"])
            .args(["--cluster", &self.url(index % 2, "node")])
            .args(&self.flags)
            .env(
                "RUST_LOG",
                "wasmproc=info,wasmproc::guest=warn,wasmproc::cluster::inbox=debug,wasmproc::cluster::shards=debug",
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("a node starts");
        self.nodes[index] = Some(child);
    }

    /// What node `index` wrote on stderr, every start of it.
    fn log_of(&self, index: usize) -> String {
        (1..=self.starts[index])
            .map(|start| {
                std::fs::read_to_string(self.logs.join(format!("node-{index}-{start}.log"))).unwrap_or_default()
            })
            .collect()
    }

    /// Sends `signal` to node `index`.
    fn signal(&self, index: usize, signal: &str) {
        let pid = self.nodes[index].as_ref().expect("the node runs").id();
        let status = Command::new("kill").args([signal, &pid.to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// SIGKILLs node `index` and reaps it.
    fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The client's `wasmproc cluster ACTION ARGS…`.
    fn client(&self, args: &[&str]) -> Output {
        wasmproc()
            .arg("cluster")
            .args(args)
            .args(["--cluster", &self.url(0, "client"), "--cluster-inbox", CLIENT_INBOX])
            .output()
            .expect("the client runs")
    }

    /// Starts workflow `id` of the durable example.
    fn start_workflow(&self, id: &str) {
        let out = self.client(&["start", DURABLE, "--id", id, "--input", INPUT]);
        assert!(out.status.success(), "start {id}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Starts workflow `id` of the durable example's `posted` entry, its workers posting
    /// their answers to `recorder` at the path `/ID`.
    fn start_posted(&self, id: &str, recorder: &Recorder) {
        let input = format!("[{ROUNDS}, {:?}]", recorder.url(&format!("/{id}")));
        let out = self.client(&["start", DURABLE, "--id", id, "--entry", "posted", "--input", &input]);
        assert!(out.status.success(), "start {id}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Workflow `id`'s record once it ended.
    fn ended(&self, id: &str) -> serde_json::Value {
        let out = self.client(&["workflow", id, "--wait", &format!("{}s", PATIENCE.as_secs())]);
        let record: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("workflow {id}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        record
    }

    /// The shards' owners, as `cluster shards` lists them, or why it could not (before
    /// a node made the cluster's buckets, or while they elect their leaders).
    fn owners(&self) -> Result<Vec<String>, String> {
        let out = self.client(&["shards"]);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(|line| line.split_whitespace().nth(1).unwrap_or("-").to_owned())
            .collect())
    }

    /// Each node `cluster ls --json` lists that holds shards, by name, with its shards.
    fn shards_by_node(&self) -> std::collections::BTreeMap<String, Vec<u64>> {
        let out = self.client(&["ls", "--json"]);
        assert!(out.status.success(), "cluster ls: {}", String::from_utf8_lossy(&out.stderr));
        let mut held = std::collections::BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let node: serde_json::Value = serde_json::from_str(line).expect("a line of JSON a node");
            let shards: Vec<u64> =
                node["shards"].as_array().expect("shards").iter().filter_map(|s| s.as_u64()).collect();
            if !shards.is_empty() {
                held.insert(node["name"].as_str().expect("a name").to_owned(), shards);
            }
        }
        held
    }

    /// Waits until every shard is held, by `nodes` nodes.
    fn wait_for_owners(&self, nodes: usize) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let owners = match self.owners() {
                Ok(owners) => owners,
                Err(error) => {
                    assert!(Instant::now() < deadline, "the shards cannot be listed: {error}");
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            let mut held: Vec<&String> = owners.iter().filter(|owner| *owner != "-").collect();
            let all = held.len() == owners.len() && !owners.is_empty();
            held.sort();
            held.dedup();
            if all && held.len() == nodes {
                return;
            }
            assert!(Instant::now() < deadline, "the shards were not all held by {nodes} nodes: {owners:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        for index in 0..self.nodes.len() {
            self.kill(index);
        }
    }
}

/// The result of the workflow run once on one host, with no crash.
fn uncrashed() -> serde_json::Value {
    let out = wasmproc().args(["run", DURABLE, "--input", INPUT]).output().expect("run runs");
    assert!(out.status.success(), "run: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a JSON result")
}

/// Asserts every workflow of `ids` completed with `expected`.
fn all_completed(durable: &Durable, ids: &[String], expected: &serde_json::Value) {
    for id in ids {
        let record = durable.ended(id);
        assert_eq!(record["state"], "completed", "workflow {id}: {record}");
        assert_eq!(&record["result"], expected, "workflow {id}: {record}");
    }
}

/// A small random number from the clock and the process id (no dependency for it).
fn random(below: u64) -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    (u64::from(nanos) ^ u64::from(std::process::id()).rotate_left(17)) % below.max(1)
}

/// Asserts every workflow of `ids` posted each of its answers to `recorder` once, as
/// commands: every post has an idempotency key, the posts of one key agree, and the
/// answers of the distinct keys are every answer. A post is repeated only when a kill
/// caught it in flight, with its key (counted and returned).
fn posted_once(recorder: &Recorder, ids: &[String]) -> usize {
    let received = recorder.received();
    let mut repeats = 0;
    for id in ids {
        let path = format!("/{id}");
        let mut keys: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
        for post in received.iter().filter(|post| post.path == path) {
            let key = post.key.clone().unwrap_or_else(|| panic!("workflow {id} posted without a key: {post:?}"));
            if let Some(before) = keys.insert(key, &post.body) {
                assert_eq!(before, post.body, "workflow {id} posted another answer with the key of {post:?}");
                repeats += 1;
            }
        }
        let answers: u64 = keys
            .values()
            .map(|body| body.parse::<u64>().unwrap_or_else(|e| panic!("a posted answer {body:?}: {e}")))
            .sum();
        assert_eq!(keys.len(), 36, "workflow {id}: 3 workers posted 12 answers each, once per key: {keys:?}");
        assert_eq!(answers, POSTED, "workflow {id}: {keys:?}");
    }
    repeats
}

#[test]
fn workflows_end_as_uncrashed_though_nodes_are_killed_at_random_moments() {
    let expected = uncrashed();
    let recorder = Recorder::start();
    // Commits in flight together, so that kills land between them too.
    let mut durable = Durable::start_with(&["--allow-host", &recorder.host(), "--journal-pipeline", "4"]);
    let mut ids = Vec::new();
    // Eight kills, each at a random moment of a wave of workflows started just before,
    // of a random node, restarted at once: every kill lands on running workflows, whose
    // workers post their answers over HTTP (a side effect outside the journal).
    for wave in 0..8 {
        for n in 0..3 {
            let id = format!("k{wave}-{n}");
            durable.start_posted(&id, &recorder);
            ids.push(id);
        }
        std::thread::sleep(Duration::from_millis(100 + random(700)));
        let victim = random(3) as usize;
        durable.kill(victim);
        durable.start_node(victim);
    }
    all_completed(&durable, &ids, &expected);
    let repeats = posted_once(&recorder, &ids);
    eprintln!("8 kills: {repeats} posts in flight at a kill carried out again with their keys");
    durable.wait_for_owners(3);
}

#[test]
fn a_node_frozen_past_its_leases_gives_its_shards_up_and_writes_nothing() {
    let expected = uncrashed();
    let recorder = Recorder::start();
    // Commits in flight together: a node frozen with some sent must still write none.
    let durable = Durable::start_with(&["--allow-host", &recorder.host(), "--journal-pipeline", "4"]);
    let ids: Vec<String> = (0..6).map(|n| format!("f{n}")).collect();
    for id in &ids {
        durable.start_posted(id, &recorder);
    }
    durable.signal(0, "-STOP");
    // The others take its shards once its leases pass.
    durable.wait_for_owners(2);
    all_completed(&durable, &ids, &expected);
    durable.signal(0, "-CONT");
    // Thawed, it finds its leases lost, or its journals fenced, and stops those shards:
    // its processes there end unrecorded, and no record says otherwise.
    let deadline = Instant::now() + PATIENCE;
    while !durable.log_of(0).contains("stopping shard") {
        assert!(Instant::now() < deadline, "the thawed node did not stop its lost shards:\n{}", durable.log_of(0));
        std::thread::sleep(Duration::from_millis(200));
    }
    all_completed(&durable, &ids, &expected);
    // Nothing it still had running posted an answer of its own.
    posted_once(&recorder, &ids);
    // And it takes part again.
    durable.wait_for_owners(3);
}

#[test]
fn the_loss_of_one_nats_server_loses_nothing() {
    let expected = uncrashed();
    let mut durable = Durable::start();
    let ids: Vec<String> = (0..6).map(|n| format!("s{n}")).collect();
    for id in &ids {
        durable.start_workflow(id);
    }
    std::thread::sleep(Duration::from_millis(200 + random(300)));
    // The server no node is connected to: its replicas go, the other two keep quorum.
    durable.servers.servers[2].stop();
    all_completed(&durable, &ids, &expected);
    let more: Vec<String> = (0..3).map(|n| format!("s-after-{n}")).collect();
    for id in &more {
        durable.start_workflow(id);
    }
    all_completed(&durable, &more, &expected);
}

#[test]
fn a_shards_journal_verifies_against_its_program_while_it_runs() {
    let durable = Durable::start();
    let out = durable.client(&["start", DURABLE, "--id", "long", "--input", "[3, 200]"]);
    assert!(out.status.success(), "start: {}", String::from_utf8_lossy(&out.stderr));
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a record");
    let shard = record["shard"].to_string();
    // Once it runs, its shard's journal holds it unfinished: replayed as recorded.
    let deadline = Instant::now() + PATIENCE;
    let verified = loop {
        let out = wasmproc()
            .args(["journal", "verify", DURABLE, "--shard", &shard, "--cluster", &durable.url(0, "node")])
            .output()
            .expect("verify runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "verify: {text}{}", String::from_utf8_lossy(&out.stderr));
        if !text.contains("0 unfinished processes") {
            break text;
        }
        assert!(Instant::now() < deadline, "the workflow never showed in its shard's journal: {text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(verified.contains("replay as recorded") && verified.contains(": ok, "), "{verified}");
    // A program that did not write it is told apart.
    let out = wasmproc()
        .args(["journal", "verify", wasmproc_tests::guests::TIMERS, "--shard", &shard])
        .args(["--cluster", &durable.url(0, "node")])
        .output()
        .expect("verify runs");
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let record = durable.ended("long");
    assert_eq!(record["state"], "completed", "{record}");
}

/// A shard's workflows get the nodes' directories, variables and HTTP hosts, and with
/// `--shared-kv` the store every node shares: fetchers on every shard count their
/// fetches of one URL by compare-and-swap, and each fetch counts once.
#[test]
fn a_shards_workflows_get_the_nodes_directories_variables_and_shared_store() {
    let notes = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("durable-notes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&notes);
    std::fs::create_dir_all(&notes).expect("a directory for the notes");
    let granted = format!("{}::/notes", notes.display());
    let recorder = Recorder::start();
    let durable = Durable::start_with(&[
        "--dir-rw",
        &granted,
        "--env",
        "NOTES_TITLE=Groceries",
        "--allow-host",
        &recorder.host(),
        "--shared-kv",
    ]);
    let notes_wasm = wasmproc_tests::guests::NOTES;
    for (id, entry, input) in [("add", "add", "\"apples\""), ("list", "list", "null")] {
        let out = durable.client(&["start", notes_wasm, "--id", id, "--entry", entry, "--input", input]);
        assert!(out.status.success(), "start {id}: {}", String::from_utf8_lossy(&out.stderr));
        let record = durable.ended(id);
        assert_eq!(record["state"], "completed", "{record}");
        if id == "add" {
            assert_eq!(record["result"], 1, "{record}");
        } else {
            assert_eq!(record["result"], "Groceries\n1. apples", "{record}");
        }
    }
    assert_eq!(std::fs::read_to_string(notes.join("notes.txt")).expect("the note was written"), "apples\n");

    let input = serde_json::json!({ "url": recorder.url("/counted") }).to_string();
    let ids: Vec<String> = (0..6).map(|n| format!("fetch{n}")).collect();
    for id in &ids {
        let out = durable.client(&["start", wasmproc_tests::guests::FETCHER, "--id", id, "--input", &input]);
        assert!(out.status.success(), "start {id}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut counts: Vec<u64> = ids
        .iter()
        .map(|id| {
            let record = durable.ended(id);
            assert_eq!(record["state"], "completed", "{record}");
            record["result"]["fetches"].as_u64().unwrap_or_else(|| panic!("a count of fetches: {record}"))
        })
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, [1, 2, 3, 4, 5, 6], "each fetch counted once, whichever node ran it");
}

#[test]
fn a_drained_node_hands_its_shards_over_without_a_failover() {
    let expected = uncrashed();
    let mut durable = Durable::start();
    // Shards move while the nodes even out their shares: listed again until all are held.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let held = durable.shards_by_node();
        let mut all: Vec<u64> = held.values().flatten().copied().collect();
        all.sort_unstable();
        if held.len() == 3 && all == (0..SHARDS.parse::<u64>().unwrap()).collect::<Vec<_>>() {
            break;
        }
        assert!(Instant::now() < deadline, "`cluster ls` never showed every shard held by three nodes: {held:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let ids: Vec<String> = (0..6).map(|n| format!("d{n}")).collect();
    for id in &ids {
        durable.start_workflow(id);
    }
    durable.signal(1, "-TERM");
    let status = durable.nodes[1].as_mut().expect("the node runs").wait().expect("the node ends");
    assert!(status.success(), "a drained node exits 0: {status:?}\n{}", durable.log_of(1));
    let log = durable.log_of(1);
    assert!(log.contains("gave back shard"), "{log}");
    assert!(!log.contains("stopping shard"), "a drain loses no lease: {log}");
    durable.nodes[1] = None;
    durable.wait_for_owners(2);
    let drained = format!("n1-{}", durable.starts[1]);
    assert!(durable.shards_by_node().get(&drained).is_none_or(Vec::is_empty), "the drained node holds nothing");
    all_completed(&durable, &ids, &expected);
}

/// Messages each source sends each sink in the exchanges below.
const MESSAGES: u32 = 40;

impl Durable {
    /// Starts workflow `id` of the durable example's entry `entry` with `input`; its
    /// record as written.
    fn start_entry(&self, id: &str, entry: &str, input: &str) -> serde_json::Value {
        let out = self.client(&["start", DURABLE, "--id", id, "--entry", entry, "--input", input]);
        assert!(out.status.success(), "start {id}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("a record")
    }

    /// The pid of workflow `id`'s root, once its record has one.
    /// Waits until process `pid` is in shard `shard`'s journal, as `journal ls` reads it.
    fn wait_until_journaled(&self, shard: u64, pid: u64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let out = wasmproc()
                .args(["journal", "ls", "--cluster", &self.url(0, "node"), "--shard", &shard.to_string()])
                .output()
                .expect("journal ls runs");
            if String::from_utf8_lossy(&out.stdout).contains(&pid.to_string()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "process {pid} never reached shard {shard}'s journal: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid_of(&self, id: &str) -> u64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let out = self.client(&["workflow", id]);
            if let Ok(record) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                && let Some(pid) = record["pid"].as_u64().filter(|pid| *pid != 0)
            {
                return pid;
            }
            assert!(Instant::now() < deadline, "workflow {id} got no pid: {}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts three sinks and three sources that each send every sink `MESSAGES`
    /// messages, their ids beginning with `tag`; the ids of the sinks and of the sources.
    /// Some sources and sinks are of different shards (asserted), so those messages
    /// cross shards, and nodes.
    fn start_exchange(&self, tag: &str) -> (Vec<String>, Vec<String>) {
        let sinks: Vec<String> = (0..3).map(|n| format!("{tag}-sink{n}")).collect();
        let mut shards = Vec::new();
        for id in &sinks {
            shards.push(self.start_entry(id, "sink", &format!("[3, {MESSAGES}]"))["shard"].clone());
        }
        let pids: Vec<u64> = sinks.iter().map(|id| self.pid_of(id)).collect();
        // A root's pid is its for good once its spawn is in its shard's journal: a node
        // that takes the shard before then starts the workflow again, and a message that
        // comes to the pid while nothing runs there is dropped, as to a process that
        // does not exist. The sources are told the sinks' pids from then on.
        for (shard, pid) in shards.iter().zip(&pids) {
            self.wait_until_journaled(shard.as_u64().expect("a shard number"), *pid);
        }
        let sources: Vec<String> = (0..3).map(|n| format!("{tag}-source{n}")).collect();
        let mut crossing = false;
        for id in &sources {
            let record = self.start_entry(id, "source", &format!("[{pids:?}, {MESSAGES}]"));
            crossing |= shards.iter().any(|shard| *shard != record["shard"]);
        }
        assert!(crossing, "exchange {tag}: every source and sink of one shard; pick other ids");
        (sinks, sources)
    }
}

/// Asserts every sink of `sinks` took each of its messages once and in its sender's
/// order (it fails otherwise), and every source of `sources` sent them all.
fn exchanged(durable: &Durable, (sinks, sources): &(Vec<String>, Vec<String>)) {
    for id in sinks.iter().chain(sources) {
        let record = durable.ended(id);
        assert_eq!(record["state"], "completed", "workflow {id}: {record}");
        assert_eq!(record["result"], 3 * MESSAGES, "workflow {id}: {record}");
    }
}

#[test]
fn messages_between_shards_arrive_once_and_in_order_though_nodes_are_killed() {
    let mut durable = Durable::start();
    let mut exchanges = Vec::new();
    // Four kills, each at a random moment of an exchange started just before, of a
    // random node, restarted at once: senders and receivers of every shard are lost
    // with messages in flight, in their outboxes, and in the inboxes.
    for wave in 0..4 {
        exchanges.push(durable.start_exchange(&format!("x{wave}")));
        std::thread::sleep(Duration::from_millis(50 + random(400)));
        let victim = random(3) as usize;
        durable.kill(victim);
        durable.start_node(victim);
    }
    for exchange in &exchanges {
        exchanged(&durable, exchange);
    }
    durable.wait_for_owners(3);
}

#[test]
fn messages_between_shards_arrive_once_and_in_order_across_a_drain() {
    let mut durable = Durable::start();
    let exchange = durable.start_exchange("y");
    std::thread::sleep(Duration::from_millis(random(200)));
    durable.signal(2, "-TERM");
    let status = durable.nodes[2].as_mut().expect("the node runs").wait().expect("the node ends");
    assert!(status.success(), "a drained node exits 0: {status:?}\n{}", durable.log_of(2));
    durable.nodes[2] = None;
    exchanged(&durable, &exchange);
    assert!(!durable.log_of(2).contains("stopping shard"), "a drain loses no lease: {}", durable.log_of(2));
}

#[test]
fn a_message_to_a_shard_that_does_not_exist_is_a_clear_error() {
    let durable = Durable::start();
    durable.start_entry("lonely-sink", "sink", "[1, 1]");
    let pid = wasmproc::Pid::from_u64(durable.pid_of("lonely-sink"));
    let nowhere = pid.with_node(wasmproc::cluster::shard_node(1000)).as_u64();
    durable.start_entry("astray", "source", &format!("[[{nowhere}], 1]"));
    let record = durable.ended("astray");
    assert_eq!(record["state"], "failed", "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    assert!(error.contains("there is no shard 1000: the cluster has 6 shards (0 to 5)"), "{record}");
}
