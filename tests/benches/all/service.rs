//! The service (`wasmproc serve`) through its HTTP API on loopback, against the same
//! workflows spawned through the library, and against Restate when it can be run.
//!
//! The workflow is one durable step: the SDK tour's `race` with `[0]` (a step that yields
//! one zero-length sleep, journaled, and a step that completes with its result). Each
//! side runs it in three ways, alternated with the others run after run:
//!
//! - `service/workflows-2k-c64`: 2,000 workflows, 64 clients at once, each starting a
//!   workflow (`POST /v1/workflows` with a fresh id) and waiting for its result
//!   (`GET …/result?wait=60s`) before the next: workflows started and completed a
//!   second. Baseline: the same workflows spawned and joined through the library, by 64
//!   threads, on a durable scheduler with the same journal and settings as the server's
//!   (`keep_finished`), in the bench's process: the ratio is what the API costs.
//! - `service/start-to-result-500/p50`, `/p99`: one client, one workflow at a time, the
//!   time from sending the start to having the result; baseline the library's spawn to
//!   join.
//! - `service/rss-10k-sleeping`: the resident memory of a fresh server holding 10,000
//!   workflows asleep (`race` with `[3600000]`), once, after the rest, measured once
//!   the server has suspended them (`wasmproc_processes_suspended` in its `/metrics`
//!   counts them all, after its default `--suspend-after`; at most two minutes) and
//!   rested 3 s.
//! - `service/workflows-2k-c64-beside-10k-asleep`: the throughput workload on that server
//!   while its sleepers wait, against the throughput row's runs (a server holding none):
//!   what a start and an end cost a host holding many waiting workflows. Nothing a start
//!   or an end does may grow with the workflows held.
//!
//! The server is the `wasmproc` binary built with the bench, or `SERVICE_WASMPROC`'s
//! (`serve --workers WORKERS`, quotas and rate lifted), run as a process of its own, so
//! its memory is its own.
//!
//! **Restate.** When `node` and `npm` are on `PATH`, Restate 1.7.12's server and its
//! TypeScript SDK (`@restatedev/restate-sdk`) are installed once with npm under the
//! target directory (`<target>/restate`, never into the repository), and the same three
//! workloads run against it in the same run: its ingress on loopback, a service whose
//! handler is one `ctx.run`, started with `POST /bench/run/send` and an
//! `idempotency-key` (the id), its result fetched with `GET
//! /restate/invocation/bench/run/{id}/attach`; its sleepers are `ctx.sleep` for an
//! hour; its memory is the server's and the Node service's together. Restate runs with
//! its default configuration (one node, 24 partitions). Without node or npm, or if the
//! install fails, the Restate rows are skipped with the reason printed. The goals, from
//! issue 32: at least 10× Restate's throughput (a time ratio ≤ 0.1), at most a fifth of
//! its p50, at most a tenth of its memory.
//!
//! Quick mode divides the counts by 10 (sleepers: 1,000).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc::journal::{Journal, JournalSettings};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Config, Runtime};
use wasmproc::{Capabilities, Payload, Scheduler};
use wasmproc_tests::bench::{Condition, Options, Record, Report, Sample};
use wasmproc_tests::guests::SDK_TOUR;
use wasmproc_tests::served::Served;

use crate::{WARMUP, short};

/// Clients at once in the throughput workload.
const CLIENTS: u64 = 64;
/// The longest any one request or readiness wait may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(120);
/// The Restate release measured, and the SDK version its service is written with.
const RESTATE_SERVER: &str = "@restatedev/restate-server@1.7.12";
const RESTATE_SDK: &str = "@restatedev/restate-sdk@1.17.2";

/// Measures the selected workloads into `report`.
pub fn run(options: &Options, report: &mut Report) {
    let workflows: u64 = if options.quick { 200 } else { 2_000 };
    let sequential: u64 = if options.quick { 50 } else { 500 };
    let sleepers: u64 = if options.quick { 1_000 } else { 10_000 };
    let throughput = format!("service/workflows-{}-c{CLIENTS}", short(workflows));
    let latency = format!("service/start-to-result-{}", short(sequential));
    let memory = format!("service/rss-{}-sleeping", short(sleepers));
    let beside = format!("{throughput}-beside-{}-asleep", short(sleepers));
    if ![&throughput, &latency, &memory, &beside].iter().any(|name| options.selected(name)) {
        return;
    }
    let (scratch, wasmproc, runtime) = served_bench("service");
    let client = client();
    let restate = match Restate::start(&scratch) {
        Ok(restate) => Some(restate),
        Err(why) => {
            println!("  Restate is not measured: {why}");
            None
        }
    };

    let mut alone = None;
    if options.selected(&throughput) || options.selected(&latency) {
        let sides = Paired {
            wasmproc: &wasmproc,
            scratch: &scratch,
            runtime: &runtime,
            client: &client,
            restate: restate.as_ref(),
        };
        alone = Some(paired(options, report, &sides, (&throughput, workflows), (&latency, sequential)));
    }
    if options.selected(&memory) || options.selected(&beside) {
        let server = Server::start(&wasmproc, &scratch.join("sleepers"), options.workers);
        let token = server.tenant(&runtime, &client);
        let idle = server.rss_kib();
        server.sleepers(&runtime, &client, &token, sleepers);
        let ours = server.rss_kib();
        // The same workflows as the throughput row's, while the sleepers wait: what a
        // host holding many waiting workflows pays to start and end others (its
        // baseline, the throughput row's runs on a server holding none).
        let runs: Vec<Duration> = if options.selected(&beside) {
            (0..WARMUP + options.runs)
                .map(|run| server.workflows(&runtime, &client, &token, &format!("b{run}"), workflows, CLIENTS))
                .skip(WARMUP)
                .collect()
        } else {
            Vec::new()
        };
        server.stop();
        println!("  (the server before its sleepers: {:.0} MiB resident)", idle as f64 / 1024.0);
        if options.selected(&memory) {
            let mut record = Record::single(&memory, "MiB", ours as f64 / 1024.0);
            if let Some(restate) = &restate {
                restate.sleepers(&runtime, &client, sleepers);
                let theirs = restate.rss_kib();
                record = record.with_baseline(theirs as f64 / 1024.0, ours as f64 / theirs as f64);
                record = record.goal(Condition::ratio_at_most(0.1));
            }
            report.push(record);
        }
        if options.selected(&beside) {
            report.push(Record::rate(&beside, "workflows/s", workflows, &Sample::of(runs), alone.as_ref()));
        }
    }
}

/// What the paired workloads run against.
struct Paired<'a> {
    wasmproc: &'a Path,
    scratch: &'a Path,
    runtime: &'a tokio::runtime::Runtime,
    client: &'a reqwest::Client,
    restate: Option<&'a Restate>,
}

/// The throughput and latency workloads, each side after the other, run after run; the
/// API's throughput runs.
fn paired(
    options: &Options,
    report: &mut Report,
    sides: &Paired<'_>,
    (throughput, workflows): (&str, u64),
    (latency, sequential): (&str, u64),
) -> Sample {
    let Paired { wasmproc, scratch, runtime, client, restate } = *sides;
    let server = Server::start(wasmproc, &scratch.join("api"), options.workers);
    let token = server.tenant(runtime, client);
    let library = Library::open(&scratch.join("library"), options.workers);
    let (mut api, mut lib, mut them) = (Vec::new(), Vec::new(), Vec::new());
    let (mut api_latency, mut lib_latency, mut their_latency) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..WARMUP + options.runs {
        let measured = run >= WARMUP;
        let prefix = format!("r{run}");
        let ours = server.workflows(runtime, client, &token, &prefix, workflows, CLIENTS);
        let library_time = library.workflows(workflows, CLIENTS);
        let theirs = restate.map(|r| r.workflows(runtime, client, &prefix, workflows, CLIENTS));
        let our_latencies = server.latencies(runtime, client, &token, &format!("{prefix}s"), sequential);
        let library_latencies = library.latencies(sequential);
        let their_latencies = restate.map(|r| r.latencies(runtime, client, &format!("{prefix}s"), sequential));
        if measured {
            api.push(ours);
            lib.push(library_time);
            api_latency.push(our_latencies);
            lib_latency.push(library_latencies);
            if let (Some(theirs), Some(latencies)) = (theirs, their_latencies) {
                them.push(theirs);
                their_latency.push(latencies);
            }
        }
    }
    let rss_before_stop = server.rss_kib();
    server.stop();
    library.stop();
    println!("  (the server after the runs: {:.0} MiB resident)", rss_before_stop as f64 / 1024.0);

    let (api, lib) = (Sample::of(api), Sample::of(lib));
    let them = (!them.is_empty()).then(|| Sample::of(them));
    // What the API costs over the library: no goal, the issue asks for the ratio.
    report.push(Record::rate(throughput, "workflows/s", workflows, &api, Some(&lib)));
    if let Some(them) = &them {
        report.push(
            Record::rate(format!("{throughput}/vs-restate"), "workflows/s", workflows, &api, Some(them))
                .goal(Condition::ratio_at_most(0.1)),
        );
    }
    for (q, label) in [(0.50, "p50"), (0.99, "p99")] {
        let ours = Sample::quantile(&api_latency, q);
        report.push(Record::micros(format!("{latency}/{label}"), &ours, &Sample::quantile(&lib_latency, q)));
        if !their_latency.is_empty() {
            let record =
                Record::micros(format!("{latency}/{label}/vs-restate"), &ours, &Sample::quantile(&their_latency, q));
            report.push(if label == "p50" { record.goal(Condition::ratio_at_most(0.2)) } else { record });
        }
    }
    api
}

/// What a bench of `wasmproc serve` named `name` starts from: an empty scratch directory
/// of its own, the `wasmproc` binary to serve (`SERVICE_WASMPROC`, or this workspace's),
/// and a runtime for its clients.
pub(crate) fn served_bench(name: &str) -> (PathBuf, PathBuf, tokio::runtime::Runtime) {
    let scratch = crate::target_dir().join("bench").join(name);
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("the scratch directory can be made");
    let wasmproc = std::env::var_os("SERVICE_WASMPROC").map_or_else(crate::cli::build_wasmproc, PathBuf::from);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name(format!("bench-{name}-client"))
        .build()
        .expect("the client's runtime starts");
    (scratch, wasmproc, runtime)
}

/// A plain-HTTP client with a connection kept for each client at once.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(super::http::plain_tls())
        .no_proxy()
        .pool_max_idle_per_host(CLIENTS as usize)
        .build()
        .expect("the client builds")
}

/// A loopback port free now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port").port()
}

/// `pid`'s resident memory, in KiB, from `/proc`.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs `count` workflows with `clients` clients at once, `one(i)` each; the wall time.
fn concurrently<F, Fut>(runtime: &tokio::runtime::Runtime, count: u64, clients: u64, one: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let one = Arc::new(one);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let (one, next) = (one.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            break;
                        }
                        one(i).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a client finishes");
        }
    });
    start.elapsed()
}

/// A request's status and body, or a panic naming it.
async fn exchange(request: reqwest::RequestBuilder, what: &str) -> (u16, Vec<u8>) {
    let answer = tokio::time::timeout(PATIENCE, request.send())
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {PATIENCE:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = answer.status().as_u16();
    let body = answer.bytes().await.unwrap_or_else(|e| panic!("{what}: the body: {e}"));
    (status, body.to_vec())
}

/// A `wasmproc serve` of its own, killed when dropped.
pub(crate) struct Server {
    served: Served,
    pub(crate) url: String,
}

impl Server {
    pub(crate) fn start(wasmproc: &Path, data: &Path, workers: usize) -> Server {
        let workers = workers.to_string();
        let flags = ["--rate", "1000000", "--max-running", "1000000", "--workers", &workers];
        let served = Served::start(Command::new(wasmproc), data, &flags, PATIENCE);
        Server { url: served.url(), served }
    }

    /// Adds a tenant and deploys the SDK tour as `tour`; the tenant's token.
    pub(crate) fn tenant(&self, runtime: &tokio::runtime::Runtime, client: &reqwest::Client) -> String {
        let admin = self.served.admin_token();
        let bytes = std::fs::read(SDK_TOUR).expect("the SDK tour guest");
        runtime.block_on(async {
            let add = client
                .post(format!("{}/v1/tenants", self.url))
                .bearer_auth(&admin)
                .body(json!({"name": "bench"}).to_string());
            let (status, body) = exchange(add, "adding a tenant").await;
            assert_eq!(status, 201, "adding a tenant: {}", String::from_utf8_lossy(&body));
            let answer: Value = serde_json::from_slice(&body).expect("JSON");
            let token = answer["token"].as_str().expect("a token").to_owned();
            let deploy = client.post(format!("{}/v1/components?name=tour", self.url)).bearer_auth(&token).body(bytes);
            let (status, body) = exchange(deploy, "deploying the tour").await;
            assert!(status == 201 || status == 200, "deploying the tour: {}", String::from_utf8_lossy(&body));
            token
        })
    }

    /// Starts workflow `id` of `race` with `input` and waits for its result, which must
    /// be `{"ok": expected}`.
    async fn one(client: &reqwest::Client, url: &str, token: &str, id: &str, input: &Value, expected: &Value) {
        let start = client
            .post(format!("{url}/v1/workflows"))
            .bearer_auth(token)
            .body(json!({"id": id, "component": "tour", "method": "race", "input": input}).to_string());
        let (status, body) = exchange(start, "a start").await;
        assert_eq!(status, 201, "a start: {}", String::from_utf8_lossy(&body));
        let result = client.get(format!("{url}/v1/workflows/{id}/result?wait=60s")).bearer_auth(token);
        let (status, body) = exchange(result, "a result").await;
        assert_eq!(status, 200, "a result: {}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(answer["workflow"]["result"], json!({"ok": expected}), "{answer}");
    }

    pub(crate) fn workflows(
        &self,
        runtime: &tokio::runtime::Runtime,
        client: &reqwest::Client,
        token: &str,
        prefix: &str,
        count: u64,
        clients: u64,
    ) -> Duration {
        let (client, url, token, prefix) = (client.clone(), self.url.clone(), token.to_owned(), prefix.to_owned());
        concurrently(runtime, count, clients, move |i| {
            let (client, url, token, id) = (client.clone(), url.clone(), token.clone(), format!("{prefix}-{i}"));
            async move { Server::one(&client, &url, &token, &id, &json!([0]), &json!(0)).await }
        })
    }

    fn latencies(
        &self,
        runtime: &tokio::runtime::Runtime,
        client: &reqwest::Client,
        token: &str,
        prefix: &str,
        count: u64,
    ) -> Vec<Duration> {
        runtime.block_on(async {
            let mut latencies = Vec::with_capacity(count as usize);
            for i in 0..count {
                let begun = Instant::now();
                Server::one(client, &self.url, token, &format!("{prefix}-{i}"), &json!([0]), &json!(0)).await;
                latencies.push(begun.elapsed());
            }
            latencies
        })
    }

    /// Starts `count` workflows that sleep an hour, and waits until each has begun
    /// sleeping (its history shows the step that yielded the sleep) for a sample of them.
    fn sleepers(&self, runtime: &tokio::runtime::Runtime, client: &reqwest::Client, token: &str, count: u64) {
        let (shared, url, shared_token) = (client.clone(), self.url.clone(), token.to_owned());
        concurrently(runtime, count, CLIENTS, move |i| {
            let (client, url, token) = (shared.clone(), url.clone(), shared_token.clone());
            async move {
                let start = client.post(format!("{url}/v1/workflows")).bearer_auth(&token).body(
                    json!({"id": format!("sleeper-{i}"), "component": "tour", "method": "race", "input": [3_600_000]})
                        .to_string(),
                );
                let (status, body) = exchange(start, "a sleeper's start").await;
                assert_eq!(status, 201, "a sleeper's start: {}", String::from_utf8_lossy(&body));
            }
        });
        // Started is not yet asleep: the first step runs after the answer. The last one
        // started being asleep means the queue has drained.
        let last = format!("{}/v1/workflows/sleeper-{}/history", self.url, count - 1);
        let begun = Instant::now();
        runtime.block_on(async {
            loop {
                let (status, body) = exchange(client.get(&last).bearer_auth(token), "a sleeper's history").await;
                let history: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if status == 200 && history["processes"][0]["steps"].as_u64() >= Some(1) {
                    break;
                }
                assert!(begun.elapsed() < PATIENCE, "the last sleeper never slept: {history}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        // Asleep for longer than the server's `--suspend-after` (its default), each
        // sleeper leaves memory: the memory measured is the server's with them suspended.
        let admin = self.served.admin_token();
        let metrics = format!("{}/metrics", self.url);
        let begun = Instant::now();
        let suspended = runtime.block_on(async {
            loop {
                let (_, body) = exchange(client.get(&metrics).bearer_auth(&admin), "the metrics").await;
                let text = String::from_utf8_lossy(&body);
                let suspended: u64 = text
                    .lines()
                    .find_map(|line| line.strip_prefix("wasmproc_processes_suspended ")?.trim().parse().ok())
                    .unwrap_or(0);
                if suspended >= count || begun.elapsed() > PATIENCE {
                    break suspended;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        println!(
            "  ({suspended} of {count} sleepers suspended {:.1} s after the last slept)",
            begun.elapsed().as_secs_f64()
        );
        // Let the server settle as it does at rest: its instances' memory slots and
        // stacks that no process took for a second are given back (two of the engine's
        // coolings), and its heap trimmed after them.
        std::thread::sleep(Duration::from_secs(3));
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.served.pid())
    }

    pub(crate) fn stop(self) {
        self.served.kill();
    }
}

/// The library's side: a durable scheduler on a journal of its own, with the server's
/// journal settings and grants, the SDK tour as kind `tour`.
struct Library {
    scheduler: Scheduler,
}

impl Library {
    fn open(dir: &Path, workers: usize) -> Library {
        let runtime = Runtime::new(Config::default().no_disk_cache()).expect("the runtime starts");
        let component = runtime.load(Path::new(SDK_TOUR)).expect("the SDK tour loads");
        let journal = Journal::open(dir).expect("the journal opens");
        let mut settings = JournalSettings::default();
        settings.keep_finished = true;
        let journal = journal.settings(settings);
        let scheduler = Scheduler::builder()
            .workers(workers)
            .journal(journal)
            .capabilities(Capabilities::over_self())
            .kind("tour", component)
            .build()
            .expect("the scheduler starts");
        Library { scheduler }
    }

    fn one(&self, input: &Payload) {
        let options = SpawnOptions::new("race").input(vec![input.clone()]);
        let process = self.scheduler.handle().spawn(Spawnable::kind("tour"), options).expect("the workflow spawns");
        let result = process.join_timeout(PATIENCE).expect("the workflow ends").expect("the workflow succeeds");
        assert_eq!(result.to_json_value(), json!(0));
    }

    fn workflows(&self, count: u64, clients: u64) -> Duration {
        let input = Payload::json(&json!([0])).expect("JSON");
        let next = AtomicU64::new(0);
        let start = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..clients {
                scope.spawn(|| {
                    while next.fetch_add(1, Ordering::Relaxed) < count {
                        self.one(&input);
                    }
                });
            }
        });
        start.elapsed()
    }

    fn latencies(&self, count: u64) -> Vec<Duration> {
        let input = Payload::json(&json!([0])).expect("JSON");
        (0..count)
            .map(|_| {
                let begun = Instant::now();
                self.one(&input);
                begun.elapsed()
            })
            .collect()
    }

    fn stop(self) {
        self.scheduler.stop(Duration::from_secs(1));
    }
}

/// Restate's server and a Node service of the bench's handlers, registered with it;
/// both killed when dropped.
struct Restate {
    server: Child,
    service: Child,
    ingress: String,
}

/// The Node service: `run` is one `ctx.run` returning its input, `sleep` a `ctx.sleep`.
/// Node 20 lacks `Promise.withResolvers`, which the SDK uses: defined here as Node 22
/// defines it.
const SERVICE_JS: &str = r#"
if (!Promise.withResolvers) {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
    return { promise, resolve, reject };
  };
}
const restate = require("@restatedev/restate-sdk");
const bench = restate.service({
  name: "bench",
  handlers: {
    run: async (ctx, input) => await ctx.run("step", async () => input),
    sleep: async (ctx, ms) => { await ctx.sleep(ms); return 0; },
  },
});
restate.endpoint().bind(bench).listen(Number(process.argv[2]));
"#;

impl Restate {
    /// Installs Restate if needed, starts it and its service, and registers the service.
    fn start(scratch: &Path) -> Result<Restate, String> {
        let dir = crate::target_dir().join("restate");
        let binary = install(&dir)?;
        let data = scratch.join("restate");
        std::fs::create_dir_all(&data).map_err(|e| format!("cannot make {}: {e}", data.display()))?;
        let (node_port, ingress_port, admin_port, service_port) = (free_port(), free_port(), free_port(), free_port());
        let config = format!(
            "base-dir = \"{}\"\nbind-address = \"127.0.0.1:{node_port}\"\nadvertised-address = \
             \"http://127.0.0.1:{node_port}/\"\ndisable-telemetry = true\nlog-filter = \"warn\"\n\n[admin]\nbind-address \
             = \"127.0.0.1:{admin_port}\"\n\n[ingress]\nbind-address = \"127.0.0.1:{ingress_port}\"\n",
            data.join("server").display()
        );
        let config_file = data.join("restate.toml");
        std::fs::write(&config_file, config).map_err(|e| format!("cannot write its configuration: {e}"))?;
        let server = Command::new(&binary)
            .arg("--config-file")
            .arg(&config_file)
            .args(["--no-logo", "--listen-mode", "tcp"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
        let script = dir.join("bench-service.js");
        std::fs::write(&script, SERVICE_JS).map_err(|e| format!("cannot write the service: {e}"))?;
        let service = Command::new("node")
            .arg(&script)
            .arg(service_port.to_string())
            .current_dir(&dir)
            .env("RESTATE_LOGGING", "WARN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let service = match service {
            Ok(service) => service,
            Err(e) => {
                let mut server = server;
                let _ = server.kill();
                let _ = server.wait();
                return Err(format!("cannot run node: {e}"));
            }
        };
        let restate = Restate { server, service, ingress: format!("http://127.0.0.1:{ingress_port}") };
        restate.register(admin_port, service_port)?;
        Ok(restate)
    }

    /// Registers the service with the server once both answer.
    fn register(&self, admin_port: u16, service_port: u16) -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let client = client();
        let begun = Instant::now();
        runtime.block_on(async {
            loop {
                let answer = client
                    .post(format!("http://127.0.0.1:{admin_port}/deployments"))
                    .header("content-type", "application/json")
                    .body(json!({"uri": format!("http://127.0.0.1:{service_port}")}).to_string())
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                match answer {
                    Ok(answer) if answer.status().is_success() => return Ok(()),
                    _ if begun.elapsed() > PATIENCE => {
                        return Err(format!("the service was not registered within {PATIENCE:?}: {answer:?}"));
                    }
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        })
    }

    async fn one(client: &reqwest::Client, ingress: &str, id: &str) {
        let send = client
            .post(format!("{ingress}/bench/run/send"))
            .header("content-type", "application/json")
            .header("idempotency-key", id)
            .body("0");
        let (status, body) = exchange(send, "a Restate send").await;
        assert!((200..300).contains(&status), "a Restate send: {status} {}", String::from_utf8_lossy(&body));
        let attach = client.get(format!("{ingress}/restate/invocation/bench/run/{id}/attach"));
        let (status, body) = exchange(attach, "a Restate attach").await;
        assert_eq!((status, body.as_slice()), (200, b"0".as_slice()), "{}", String::from_utf8_lossy(&body));
    }

    fn workflows(
        &self,
        runtime: &tokio::runtime::Runtime,
        client: &reqwest::Client,
        prefix: &str,
        count: u64,
        clients: u64,
    ) -> Duration {
        let (client, ingress, prefix) = (client.clone(), self.ingress.clone(), prefix.to_owned());
        concurrently(runtime, count, clients, move |i| {
            let (client, ingress, id) = (client.clone(), ingress.clone(), format!("{prefix}-{i}"));
            async move { Restate::one(&client, &ingress, &id).await }
        })
    }

    fn latencies(
        &self,
        runtime: &tokio::runtime::Runtime,
        client: &reqwest::Client,
        prefix: &str,
        count: u64,
    ) -> Vec<Duration> {
        runtime.block_on(async {
            let mut latencies = Vec::with_capacity(count as usize);
            for i in 0..count {
                let begun = Instant::now();
                Restate::one(client, &self.ingress, &format!("{prefix}-{i}")).await;
                latencies.push(begun.elapsed());
            }
            latencies
        })
    }

    /// Sends `count` invocations of `sleep` for an hour, and gives them time to reach it.
    fn sleepers(&self, runtime: &tokio::runtime::Runtime, client: &reqwest::Client, count: u64) {
        let (client, ingress) = (client.clone(), self.ingress.clone());
        concurrently(runtime, count, CLIENTS, move |i| {
            let (client, ingress) = (client.clone(), ingress.clone());
            async move {
                let send = client
                    .post(format!("{ingress}/bench/sleep/send"))
                    .header("content-type", "application/json")
                    .header("idempotency-key", format!("sleeper-{i}"))
                    .body("3600000");
                let (status, body) = exchange(send, "a Restate sleeper").await;
                assert!((200..300).contains(&status), "a Restate sleeper: {}", String::from_utf8_lossy(&body));
            }
        });
        // A send is answered once the invocation is recorded, before it runs: 10 s for
        // the service to have run each to its sleep (it takes a few ms each).
        std::thread::sleep(Duration::from_secs(10));
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.server.id()) + rss_kib(self.service.id())
    }
}

impl Drop for Restate {
    fn drop(&mut self) {
        for child in [&mut self.service, &mut self.server] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Restate's server binary under `dir`, installed there with npm (with the SDK) if it
/// is missing; the error says why there is none.
fn install(dir: &Path) -> Result<PathBuf, String> {
    let works = |program: &str| Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success());
    if !works("node") || !works("npm") {
        return Err("no `node` and `npm` on PATH".to_owned());
    }
    let find = || -> Option<PathBuf> {
        let scope = dir.join("node_modules/@restatedev");
        std::fs::read_dir(&scope)
            .ok()?
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("restate-server-linux"))
            .map(|entry| entry.path().join("bin/restate-server"))
            .find(|binary| binary.is_file())
    };
    let sdk = dir.join("node_modules/@restatedev/restate-sdk/package.json");
    if find().is_none() || !sdk.is_file() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let status = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"])
            .arg(dir)
            .args([RESTATE_SERVER, RESTATE_SDK])
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("npm could not be run: {e}"))?;
        if !status.success() {
            return Err(format!("npm could not install {RESTATE_SERVER} and {RESTATE_SDK} ({status})"));
        }
    }
    find().ok_or_else(|| format!("npm installed no restate-server binary for this platform under {}", dir.display()))
}
