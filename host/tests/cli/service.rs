//! `wasmproc serve` and its client commands, against the real server on loopback: the
//! life of a workflow, idempotent starts, cancel and terminate, tenants kept apart, bad
//! requests, and a sleeping workflow carried across `kill -9` restarts of the server.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc_tests::HANG;
use wasmproc_tests::guests::{COUNTER, FETCHER, NOTES, SDK_TOUR};
use wasmproc_tests::served::Served;
use wasmproc_tests::site::Site;

use super::{Ran, finish, run, scratch, wasmproc};

/// A `wasmproc serve` on a free loopback port, killed (SIGKILL) when dropped.
pub(super) struct Server {
    served: Served,
    address: String,
    data: PathBuf,
}

impl Server {
    pub(super) fn start(data: &Path) -> Server {
        Server::start_with(data, &[])
    }

    fn start_with(data: &Path, flags: &[&str]) -> Server {
        let mut flags = flags.to_vec();
        flags.extend_from_slice(&["--grace", "1s"]);
        let served = Served::start(wasmproc(&[]), data, &flags, HANG);
        Server { address: served.address().to_owned(), data: served.data().to_owned(), served }
    }

    pub(super) fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub(super) fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data.join("admin.token")).expect("the admin token").trim().to_owned()
    }

    /// A client command against this server with `token`.
    pub(super) fn client(&self, token: &str, args: &[&str]) -> Ran {
        let url = self.url();
        let mut command = wasmproc(args);
        command.env("WASMPROC_SERVER", url).env("WASMPROC_TOKEN", token).stdin(Stdio::null());
        finish(command.output().expect("the client runs"))
    }

    /// Adds tenant `name`; its token.
    pub(super) fn tenant(&self, name: &str) -> String {
        let added = self.client(&self.admin_token(), &["tenant", "add", name]);
        assert_eq!(added.code, 0, "{}", added.stderr);
        added.stdout.trim().to_owned()
    }

    /// A raw request: its status and JSON body.
    pub(super) fn http(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, Value) {
        self.http_with(method, path, token, "", body)
    }

    /// A raw request with `headers` (whole lines, each ending in `\r\n`) beside the token
    /// and the length: its status and JSON body.
    fn http_with(&self, method: &str, path: &str, token: Option<&str>, headers: &str, body: &[u8]) -> (u16, Value) {
        let answer = self.exchange_with(method, path, token, headers, body);
        let status =
            answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer:?}"));
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    /// A raw request's body, as text.
    pub(super) fn raw(&self, method: &str, path: &str, token: Option<&str>) -> String {
        let answer = self.exchange(method, path, token, b"");
        answer.split_once("\r\n\r\n").map_or(String::new(), |(_, body)| body.to_owned())
    }

    /// A request over a connection of its own: the whole answer, head and body.
    pub(super) fn exchange(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> String {
        self.exchange_with(method, path, token, "", body)
    }

    /// [`Server::exchange`] with `headers`; a `Content-Length` among them replaces the
    /// body's own.
    pub(super) fn exchange_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &str,
        body: &[u8],
    ) -> String {
        let mut stream = TcpStream::connect(&self.address).expect("the server accepts");
        stream.set_read_timeout(Some(HANG)).expect("a read timeout");
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let length = if headers.to_ascii_lowercase().contains("content-length:") {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}{headers}{length}Connection: close\r\n\r\n",
            self.address,
        );
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).expect("the request is sent");
        // The answer's head, then as much body as it says: a server that answers before
        // reading a body it refused may keep the connection open for the rest.
        let mut answer = Vec::new();
        let mut byte = [0u8; 1];
        while !answer.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).expect("an answer") {
                0 => break,
                _ => answer.push(byte[0]),
            }
        }
        let head = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        let length = head.lines().find_map(|line| line.strip_prefix("content-length:")?.trim().parse::<u64>().ok());
        match length {
            Some(length) => (&mut stream).take(length).read_to_end(&mut answer).map(drop),
            None => stream.read_to_end(&mut answer).map(drop),
        }
        .expect("the answer's body");
        String::from_utf8_lossy(&answer).into_owned()
    }

    pub(super) fn kill(self) {
        self.served.kill();
    }
}

/// Deploys the SDK tour as `tour` for `token`.
pub(super) fn deploy_tour(server: &Server, token: &str) -> String {
    let deployed = server.client(token, &["deploy", SDK_TOUR, "--name", "tour", "--json"]);
    assert_eq!(deployed.code, 0, "{}", deployed.stderr);
    let answer: Value = serde_json::from_str(&deployed.stdout).expect("JSON");
    answer["component"]["hash"].as_str().expect("a hash").to_owned()
}

fn json_out(ran: &Ran) -> Value {
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {:?} {:?}", ran.stdout, ran.stderr))
}

#[test]
fn a_workflow_lives_through_the_api_from_start_to_forget() {
    let server = Server::start(&scratch("serve-life"));
    let token = server.tenant("acme");
    let hash = deploy_tour(&server, &token);
    let again = server.client(&token, &["deploy", SDK_TOUR]);
    assert!(again.stdout.starts_with(&format!("already deployed {hash}")), "{}", again.stdout);

    // `deadline` waits at most 60 s for a message; a signal ends the wait.
    let started = server.client(&token, &["start", "tour", "--id", "w1", "--method", "deadline", "--input", "60000"]);
    assert_eq!(started.code, 0, "{}", started.stderr);
    let status = json_out(&server.client(&token, &["status", "w1", "--json"]));
    assert_eq!(
        (status["workflow"]["state"].as_str(), status["workflow"]["component"].as_str()),
        (Some("running"), Some(hash.as_str()))
    );
    let metrics = server.raw("GET", "/metrics", Some(&server.admin_token()));
    assert!(metrics.contains("wasmproc_workflows_running{tenant=\"acme\"} 1"), "{metrics}");
    // Not ended yet: `result` without a wait says so with exit code 4.
    assert_eq!(server.client(&token, &["result", "w1"]).code, 4);

    // The same id and request: the same workflow; another request: a conflict.
    let same = server.http(
        "POST",
        "/v1/workflows",
        Some(&token),
        br#"{"id":"w1","component":"tour","method":"deadline","input":60000}"#,
    );
    assert_eq!((same.0, &same.1["workflow"]["pid"]), (200, &status["workflow"]["pid"]));
    let other = server.client(&token, &["start", "tour", "--id", "w1", "--method", "deadline", "--input", "5"]);
    assert_eq!(other.code, 2);
    assert!(other.stderr.contains("(409)") && other.stderr.contains("workflow `w1` exists"), "{}", other.stderr);

    let signalled = server.client(&token, &["signal", "w1", "go", "\"hello\""]);
    assert_eq!(signalled.code, 0, "{}", signalled.stderr);
    let result = server.client(&token, &["result", "w1", "--wait", "20s"]);
    assert_eq!((result.code, result.stdout.trim()), (0, "\"done\""), "{}", result.stderr);

    let listed = json_out(&server.client(&token, &["ps", "--state", "completed", "--json"]));
    let ids: Vec<&str> = listed["workflows"].as_array().unwrap().iter().filter_map(|w| w["id"].as_str()).collect();
    assert_eq!(ids, ["w1"]);
    assert_eq!(json_out(&server.client(&token, &["ps", "--state", "running", "--json"]))["workflows"], json!([]));
    let refused = server.client(&token, &["ps", "--limit", "5000"]);
    assert!(refused.code == 2 && refused.stderr.contains("`limit` 5000: a page holds 1 to 1000"), "{}", refused.stderr);
    // By when they started: within the last hour, yes; after it or before it started, no.
    let ids_of = |args: &[&str]| -> Vec<String> {
        let listed = json_out(&server.client(&token, &[&["ps", "--json"], args].concat()));
        listed["workflows"].as_array().unwrap().iter().filter_map(|w| w["id"].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(ids_of(&["--since", "1h"]), ["w1"]);
    assert_eq!(ids_of(&["--after", "w1"]), Vec::<String>::new());
    let started = status["workflow"]["started_ms"].as_u64().expect("a start time");
    let page = |query: String| server.http("GET", &format!("/v1/workflows?{query}"), Some(&token), b"").1;
    assert_eq!(page(format!("started_after={}", started + 1))["workflows"], json!([]));
    assert_eq!(page(format!("started_before={started}"))["workflows"], json!([]));
    assert_eq!(page(format!("started_after={started}&started_before={}", started + 1))["workflows"][0]["id"], "w1");

    // Its history: the root's records, from its spawn to its end.
    let history = json_out(&server.client(&token, &["history", "w1", "--json"]));
    let root = &history["processes"][0];
    assert_eq!((root["method"].as_str(), root["kind"].as_str()), (Some("deadline"), Some(hash.as_str())), "{history}");
    assert!(root["steps"].as_u64() >= Some(2) && root["records"].as_array().is_some_and(|r| r.len() >= 3), "{history}");
    assert_eq!(root["ended"]["reason"], "normal", "{history}");
    let shown = server.client(&token, &["history", "w1"]);
    assert!(shown.stdout.starts_with(&format!("process {} (deadline", status["workflow"]["pid"])), "{}", shown.stdout);

    // The metrics, for the admin only: the start, the end, and the requests by route.
    assert_eq!(server.http("GET", "/metrics", Some(&token), b"").0, 403);
    let metrics = server.raw("GET", "/metrics", Some(&server.admin_token()));
    for line in [
        "wasmproc_workflows_started_total 1",
        "wasmproc_workflows_ended_total{state=\"completed\"} 1",
        "wasmproc_http_requests_total{method=\"POST\",route=\"/v1/workflows/{id}/signal\",status=\"202\"} 1",
    ] {
        assert!(metrics.contains(line), "no `{line}` in:\n{metrics}");
    }

    assert_eq!(server.client(&token, &["forget", "w1"]).code, 0);
    let gone = server.client(&token, &["status", "w1"]);
    assert!(
        gone.code == 2 && gone.stderr.contains("(404)") && gone.stderr.contains("no workflow `w1`"),
        "{}",
        gone.stderr
    );
}

#[test]
fn cancel_gives_a_workflow_its_cancel_and_terminate_ends_it() {
    let server = Server::start(&scratch("serve-cancel"));
    let token = server.tenant("acme");
    deploy_tour(&server, &token);
    // `patient` waits in every way at once; a cancel ends each wait, and it completes.
    assert_eq!(
        server.client(&token, &["start", "tour", "--id", "p", "--method", "patient", "--input", "null"]).code,
        0
    );
    assert_eq!(server.client(&token, &["cancel", "p"]).code, 0);
    let cancelled = server.client(&token, &["result", "p", "--wait", "20s", "--json"]);
    let waits = json_out(&cancelled)["workflow"]["result"]["ok"].clone();
    assert_eq!(waits.as_array().map(Vec::len), Some(3), "{waits}");
    assert!(
        waits.as_array().unwrap().iter().all(|w| w.as_str().is_some_and(|w| w.starts_with("cancelled"))),
        "{waits}"
    );

    assert_eq!(
        server.client(&token, &["start", "tour", "--id", "t", "--method", "deadline", "--input", "60000"]).code,
        0
    );
    assert_eq!(server.client(&token, &["terminate", "t"]).code, 0);
    let terminated = server.client(&token, &["result", "t", "--wait", "20s"]);
    assert_eq!(terminated.code, 1, "a terminated workflow failed");
    assert!(
        terminated.stderr.contains("workflow t failed") && terminated.stderr.contains("terminated"),
        "{}",
        terminated.stderr
    );
    // Ended: it takes no more signals.
    let late = server.client(&token, &["signal", "t", "go"]);
    assert!(late.code == 2 && late.stderr.contains("(409)"), "{}", late.stderr);
}

#[test]
fn a_tenant_sees_and_touches_nothing_of_another() {
    let server = Server::start(&scratch("serve-tenants"));
    let (acme, globex) = (server.tenant("acme"), server.tenant("globex"));
    let hash = deploy_tour(&server, &acme);
    assert_eq!(
        server.client(&acme, &["start", "tour", "--id", "secret", "--method", "deadline", "--input", "60000"]).code,
        0
    );

    // An ended one too, whose result, history and forgetting are there to be asked for.
    assert_eq!(
        server.client(&acme, &["start", "tour", "--id", "done", "--method", "deadline", "--input", "1"]).code,
        0
    );
    assert_eq!(server.client(&acme, &["result", "done", "--wait", "20s"]).code, 0);

    // Every endpoint with acme's ids, as globex: not found, as if it did not exist.
    for (method, path, body) in [
        ("GET", "/v1/workflows/secret".to_owned(), ""),
        ("GET", "/v1/workflows/secret/result".to_owned(), ""),
        ("GET", "/v1/workflows/secret/result?wait=1s".to_owned(), ""),
        ("GET", "/v1/workflows/secret/history".to_owned(), ""),
        ("POST", "/v1/workflows/secret/signal".to_owned(), r#"{"topic":"go"}"#),
        ("POST", "/v1/workflows/secret/cancel".to_owned(), ""),
        ("POST", "/v1/workflows/secret/terminate".to_owned(), ""),
        ("DELETE", "/v1/workflows/secret".to_owned(), ""),
        ("GET", "/v1/workflows/done".to_owned(), ""),
        ("GET", "/v1/workflows/done/result".to_owned(), ""),
        ("GET", "/v1/workflows/done/history".to_owned(), ""),
        ("DELETE", "/v1/workflows/done".to_owned(), ""),
        ("GET", format!("/v1/components/{hash}"), ""),
        ("GET", "/v1/components/tour".to_owned(), ""),
        ("DELETE", format!("/v1/components/{hash}"), ""),
        ("DELETE", "/v1/components/tour".to_owned(), ""),
    ] {
        let (status, answer) = server.http(method, &path, Some(&globex), body.as_bytes());
        assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("not_found")), "{method} {path}: {answer}");
    }
    // Nor list them by acme's component, nor find them by prefix.
    for query in [format!("component={hash}"), "component=tour".to_owned(), "prefix=se".to_owned()] {
        let (status, answer) = server.http("GET", &format!("/v1/workflows?{query}"), Some(&globex), b"");
        assert_eq!((status, &answer["workflows"]), (200, &json!([])), "{query}: {answer}");
    }
    // Nor start acme's component, by hash or by name.
    for component in [hash.as_str(), "tour"] {
        let body = json!({"component": component, "method": "deadline", "input": 1}).to_string();
        assert_eq!(server.http("POST", "/v1/workflows", Some(&globex), body.as_bytes()).0, 404, "{component}");
    }
    assert_eq!(server.http("GET", "/v1/workflows", Some(&globex), b"").1["workflows"], json!([]));
    assert_eq!(server.http("GET", "/v1/components", Some(&globex), b"").1["components"], json!([]));
    // Acme's workflows and component were not touched.
    assert_eq!(json_out(&server.client(&acme, &["status", "secret", "--json"]))["workflow"]["state"], "running");
    assert_eq!(json_out(&server.client(&acme, &["status", "done", "--json"]))["workflow"]["state"], "completed");
    assert_eq!(server.http("GET", "/v1/components/tour", Some(&acme), b"").0, 200);
    // Tokens: none, unknown, or the admin's are not a tenant's; a tenant's is not the admin's.
    assert_eq!(server.http("GET", "/v1/workflows", None, b"").0, 401);
    assert_eq!(server.http("GET", "/v1/workflows", Some("wpt_nobody"), b"").0, 401);
    assert_eq!(server.http("GET", "/v1/workflows", Some(&server.admin_token()), b"").0, 401);
    assert_eq!(server.http("GET", "/v1/tenants", Some(&acme), b"").0, 403);
    assert_eq!(server.http("GET", "/v1/tenants/acme/policy", Some(&acme), b"").0, 403);
    assert_eq!(server.http("PUT", "/v1/tenants/acme/policy", Some(&acme), br#"{"kv": true}"#).0, 403);
}

#[test]
fn bad_requests_get_clear_errors_and_the_server_goes_on() {
    let server = Server::start(&scratch("serve-bad"));
    let token = server.tenant("acme");
    let (status, answer) = server.http("POST", "/v1/workflows", Some(&token), b"{\"component\": ");
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("line 1 column"), "{answer}");
    let (status, answer) = server.http("POST", "/v1/workflows", Some(&token), br#"{"component": "tour", "colour": 1}"#);
    assert!(
        status == 400 && answer["error"]["message"].as_str().unwrap().contains("unknown field `colour`"),
        "{answer}"
    );
    let (status, answer) = server.http("POST", "/v1/workflows", Some(&token), br#"{"component": "nothing"}"#);
    assert_eq!((status, answer["error"]["message"].as_str()), (404, Some("no component `nothing`")));
    let (status, answer) = server.http("POST", "/v1/components", Some(&token), b"not wasm at all");
    assert_eq!((status, answer["error"]["code"].as_str()), (422, Some("invalid_component")), "{answer}");
    deploy_tour(&server, &token);
    let (status, answer) =
        server.http("POST", "/v1/workflows", Some(&token), br#"{"component": "tour", "method": "nope"}"#);
    assert!(status == 400 && answer["error"]["message"].as_str().unwrap().contains("has no entry `nope`"), "{answer}");
    let (status, _) = server.http("GET", "/v1/nothing", Some(&token), b"");
    assert_eq!(status, 404);
    assert_eq!(server.http("GET", "/healthz", None, b"").0, 200);
}

#[test]
fn a_sleeping_workflow_is_woken_on_time_across_three_kill_9_restarts() {
    let data = scratch("serve-restarts");
    let server = Server::start(&data);
    let token = server.tenant("acme");
    deploy_tour(&server, &token);
    // `deadline` with no message: a 4 s timer, journaled.
    let begun = Instant::now();
    assert_eq!(
        server.client(&token, &["start", "tour", "--id", "sleeper", "--method", "deadline", "--input", "4000"]).code,
        0
    );
    let mut server = server;
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(300));
        server.kill();
        server = Server::start(&data);
        let status = json_out(&server.client(&token, &["status", "sleeper", "--json"]));
        if begun.elapsed() < Duration::from_secs(3) {
            assert_eq!(status["workflow"]["state"], "running", "resumed, still asleep");
        }
    }
    let woken = server.client(&token, &["result", "sleeper", "--wait", "30s"]);
    assert_eq!((woken.code, woken.stdout.trim()), (0, "\"timeout (4s)\""), "{}", woken.stderr);
    assert!(begun.elapsed() >= Duration::from_secs(4), "woken no earlier than its timer");
}

/// How many processes the server's `/metrics` counts as suspended.
fn suspended_now(server: &Server) -> u64 {
    let metrics = server.raw("GET", "/metrics", Some(&server.admin_token()));
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("wasmproc_processes_suspended "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `wasmproc_processes_suspended` in:\n{metrics}"))
}

/// Waits until the server counts `n` processes suspended, for at most [`HANG`].
fn until_suspended(server: &Server, n: u64) {
    let deadline = Instant::now() + HANG;
    while suspended_now(server) != n {
        assert!(Instant::now() < deadline, "{} suspended, not {n}", suspended_now(server));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Workflows whose processes left memory while they wait (`--suspend-after`) are
/// signalled, cancelled and terminated through the API as live ones are, and one asleep
/// across a `kill -9` of the server wakes on time, suspended again after the restart.
#[test]
fn suspended_workflows_are_signalled_cancelled_terminated_and_woken_across_a_kill_9() {
    let data = scratch("serve-suspended");
    let flags = ["--suspend-after", "10ms"];
    let server = Server::start_with(&data, &flags);
    let token = server.tenant("acme");
    deploy_tour(&server, &token);
    let start = |id: &str, method: &str, input: &str| {
        let started = server.client(&token, &["start", "tour", "--id", id, "--method", method, "--input", input]);
        assert_eq!(started.code, 0, "{}", started.stderr);
    };
    let begun = Instant::now();
    start("sleeper", "deadline", "5000");
    start("w", "deadline", "60000");
    start("p", "patient", "null");
    start("t", "deadline", "60000");
    until_suspended(&server, 4);

    let signalled = server.client(&token, &["signal", "w", "go", "\"hello\""]);
    assert_eq!(signalled.code, 0, "{}", signalled.stderr);
    let result = server.client(&token, &["result", "w", "--wait", "20s"]);
    assert_eq!((result.code, result.stdout.trim()), (0, "\"done\""), "{}", result.stderr);

    assert_eq!(server.client(&token, &["cancel", "p"]).code, 0);
    let cancelled = server.client(&token, &["result", "p", "--wait", "20s", "--json"]);
    let waits = json_out(&cancelled)["workflow"]["result"]["ok"].clone();
    assert!(
        waits
            .as_array()
            .is_some_and(|w| w.len() == 3 && w.iter().all(|w| w.as_str().is_some_and(|w| w.starts_with("cancelled")))),
        "{waits}"
    );

    assert_eq!(server.client(&token, &["terminate", "t"]).code, 0);
    let terminated = server.client(&token, &["result", "t", "--wait", "20s"]);
    assert!(terminated.code == 1 && terminated.stderr.contains("terminated"), "{}", terminated.stderr);
    assert_eq!(suspended_now(&server), 1, "the sleeper only");

    server.kill();
    let server = Server::start_with(&data, &flags);
    if begun.elapsed() < Duration::from_secs(4) {
        until_suspended(&server, 1);
    }
    let woken = server.client(&token, &["result", "sleeper", "--wait", "30s"]);
    assert_eq!((woken.code, woken.stdout.trim()), (0, "\"timeout (5s)\""), "{}", woken.stderr);
    assert!(begun.elapsed() >= Duration::from_secs(5), "woken no earlier than its timer");
    assert_eq!(suspended_now(&server), 0);
    let host = server.http("GET", "/v1/host", Some(&token), b"");
    assert_eq!((host.0, &host.1["suspended"]), (200, &json!(0)), "{host:?}");
}

/// A start writes the workflow's record, synced, before its spawn is journaled: a
/// `kill -9` between the two leaves the record of a workflow the journal never held.
/// Made here by killing the server and dropping the journal's runs: the next server
/// starts that workflow from its record, as it was asked to, rather than losing it.
#[test]
fn a_workflow_whose_spawn_never_reached_the_journal_starts_from_its_record() {
    let data = scratch("serve-record-first");
    let server = Server::start(&data);
    let token = server.tenant("acme");
    deploy_tour(&server, &token);
    let started =
        server.client(&token, &["start", "tour", "--id", "early", "--method", "race", "--input", "[60000, 5000]"]);
    assert_eq!(started.code, 0, "{}", started.stderr);
    let before = json_out(&server.client(&token, &["status", "early", "--json"]));
    server.kill();
    let journal = data.join("journal");
    let forgot = finish(
        wasmproc(&["journal", "forget", journal.to_str().expect("a UTF-8 path")])
            .output()
            .expect("`journal forget` runs"),
    );
    assert_eq!(forgot.code, 0, "{}", forgot.stderr);

    let server = Server::start(&data);
    let status = json_out(&server.client(&token, &["status", "early", "--json"]));
    assert_eq!(status["workflow"]["state"], "running", "started again, not lost: {status}");
    assert_eq!(status["workflow"]["started_ms"], before["workflow"]["started_ms"], "the same workflow: {status}");
    // The shorter of its two sleeps wins: index 1.
    let result = server.client(&token, &["result", "early", "--wait", "30s"]);
    assert_eq!((result.code, result.stdout.trim()), (0, "1"), "{}", result.stderr);
    let history = json_out(&server.client(&token, &["history", "early", "--json"]));
    assert_eq!(history["processes"][0]["pid"], status["workflow"]["pid"], "its journal is the new process's");
}

#[test]
fn ended_workflows_are_purged_after_the_retention_and_running_ones_are_not() {
    let server = Server::start_with(&scratch("serve-retention"), &["--retention", "1s"]);
    let token = server.tenant("acme");
    deploy_tour(&server, &token);
    for id in ["short", "long"] {
        let started = server.client(&token, &["start", "tour", "--id", id, "--method", "deadline", "--input", "60000"]);
        assert_eq!(started.code, 0, "{}", started.stderr);
    }
    // Running, it is kept past the retention; ended, it goes once the retention passes.
    assert_eq!(json_out(&server.client(&token, &["status", "short", "--json"]))["workflow"]["state"], "running");
    assert_eq!(server.client(&token, &["signal", "short", "go"]).code, 0);
    let begun = Instant::now();
    while server.http("GET", "/v1/workflows/short", Some(&token), b"").0 != 404 {
        assert!(begun.elapsed() < HANG, "the ended workflow is never purged");
        std::thread::sleep(Duration::from_millis(100));
    }
    let history = server.http("GET", "/v1/workflows/short/history", Some(&token), b"");
    assert_eq!(history.0, 404, "its history went with it");
    assert_eq!(json_out(&server.client(&token, &["status", "long", "--json"]))["workflow"]["state"], "running");
}

#[test]
fn a_tenant_past_its_quota_or_its_rate_is_refused_and_others_go_on() {
    let server = Server::start_with(&scratch("serve-quotas"), &["--max-running", "1", "--rate", "5"]);
    let (acme, globex) = (server.tenant("acme"), server.tenant("globex"));
    deploy_tour(&server, &acme);
    assert_eq!(
        server.client(&acme, &["start", "tour", "--id", "one", "--method", "deadline", "--input", "60000"]).code,
        0
    );
    let body = br#"{"id": "two", "component": "tour", "method": "deadline", "input": 60000}"#;
    let (status, answer) = server.http("POST", "/v1/workflows", Some(&acme), body);
    assert_eq!((status, answer["error"]["code"].as_str()), (429, Some("quota")), "{answer}");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("`wasmproc tenant policy acme --max-running N`"),
        "{answer}"
    );
    // Past 5 requests a second: refused, naming the flag; another tenant is not.
    let refused = (0..30)
        .map(|_| server.http("GET", "/v1/workflows", Some(&acme), b""))
        .find(|(status, _)| *status == 429)
        .expect("a burst past the rate is refused");
    assert_eq!(refused.1["error"]["code"], "rate", "{}", refused.1);
    assert!(
        refused.1["error"]["message"].as_str().unwrap().contains("`wasmproc tenant policy acme --rate N`"),
        "{}",
        refused.1
    );
    assert_eq!(server.http("GET", "/v1/workflows", Some(&globex), b"").0, 200);
}

/// Every `$ref` under `value`.
fn references<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                found.push(target);
            }
            map.values().for_each(|v| references(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, found)),
        _ => {}
    }
}

#[test]
fn the_checked_in_openapi_document_is_the_one_the_server_makes_and_serves() {
    let generated = run(&["serve", "--openapi"]);
    assert_eq!(generated.code, 0, "{}", generated.stderr);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        generated.stdout == checked_in,
        "`docs/openapi.json` is not the document the server makes: after changing the API, regenerate it with\n    \
         cargo run -p wasmproc -- serve --openapi > docs/openapi.json\nand commit it"
    );
    let document: Value = serde_json::from_str(&generated.stdout).expect("the document is JSON");
    assert_eq!(document["openapi"], "3.1.0");

    // Whole: every reference resolves, every path parameter is declared, every route
    // names its success and its errors (JSON, of the one error shape), and every route
    // behind a token says so and answers 401 without one.
    let mut found = Vec::new();
    references(&document, &mut found);
    for target in found {
        let name = target.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("a reference `{target}`"));
        assert!(document["components"]["schemas"].get(name).is_some(), "`{target}` does not resolve");
    }
    let paths = document["paths"].as_object().expect("paths");
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("a path item") {
            let route = format!("{method} {path}");
            let parameters = operation["parameters"].as_array().cloned().unwrap_or_default();
            for name in path.split('{').skip(1).filter_map(|rest| rest.split_once('}')).map(|(name, _)| name) {
                assert!(
                    parameters.iter().any(|p| p["name"] == name && p["in"] == "path" && p["required"] == true),
                    "{route}: no path parameter `{name}`"
                );
            }
            assert!(operation["tags"].as_array().is_some_and(|t| !t.is_empty()), "{route}: no tag");
            assert!(operation["summary"].is_string(), "{route}: no summary (the handler's doc comment)");
            let responses = operation["responses"].as_object().expect("responses");
            assert!(responses.keys().any(|status| status.starts_with('2')), "{route}: no success");
            // A 304 has no body, by HTTP's rules.
            for (status, response) in
                responses.iter().filter(|(status, _)| !status.starts_with('2') && *status != "304")
            {
                assert_eq!(
                    response["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                    "{route} {status}: not the error body"
                );
            }
            let guarded = operation["security"].as_array().is_some_and(|s| s.iter().any(|s| s.get("bearer").is_some()));
            let open = ["/healthz", "/readyz", "/v1/openapi.json", "/ui", "/ui/{file}"].contains(&path.as_str());
            assert_eq!(guarded, !open, "{route}: takes a token: {}", !open);
            assert_eq!(responses.contains_key("401"), guarded, "{route}: answers 401 without a token");
        }
    }
    let bearer = &document["components"]["securitySchemes"]["bearer"];
    assert_eq!((&bearer["type"], &bearer["scheme"]), (&json!("http"), &json!("bearer")), "{bearer}");

    // Served as made, without a token; routes the document names answer as it says.
    let server = Server::start(&scratch("serve-openapi"));
    let (status, served) = server.http("GET", "/v1/openapi.json", None, b"");
    assert_eq!(status, 200);
    assert!(served == document, "the served document differs from `serve --openapi`'s");
    assert_eq!(server.http("GET", "/v1/workflows", None, b"").1["error"]["code"], "unauthorized");
}

#[test]
fn every_error_is_json_with_a_stable_code_and_its_status() {
    let server = Server::start_with(&scratch("serve-errors"), &["--max-upload", "1KiB"]);
    let token = server.tenant("acme");
    let code = |(status, answer): (u16, Value)| (status, answer["error"]["code"].as_str().map(str::to_owned));
    let message = |answer: &Value| answer["error"]["message"].as_str().unwrap_or_default().to_owned();

    // Malformed JSON: where it goes wrong.
    let (status, answer) = server.http("POST", "/v1/workflows/w/signal", Some(&token), b"{\n  \"topic\": \"a\",\n  ]");
    assert_eq!(code((status, answer.clone())), (400, Some("invalid".to_owned())));
    assert!(message(&answer).contains("line 3 column 3"), "{answer}");
    let (status, answer) = server.http("POST", "/v1/tenants", Some(&server.admin_token()), br#"{"name": 7}"#);
    assert!(status == 400 && message(&answer).contains("expected a string at line 1 column 10"), "{answer}");

    // A body that says it is not JSON: 415, naming what it said and what to send.
    let text = "Content-Type: text/plain\r\n";
    let (status, answer) = server.http_with("POST", "/v1/workflows", Some(&token), text, br#"{"component": "x"}"#);
    assert_eq!(code((status, answer.clone())), (415, Some("unsupported_media_type".to_owned())));
    assert!(message(&answer).contains("`text/plain`") && message(&answer).contains("application/json"), "{answer}");
    // JSON by another name passes.
    let json = "Content-Type: application/json; charset=utf-8\r\n";
    let (status, _) = server.http_with("POST", "/v1/workflows", Some(&token), json, br#"{"component": "x"}"#);
    assert_eq!(status, 404, "no component `x`, but the body was read");

    // Bodies one byte past their bound: 413, naming it.
    let (status, answer) = server.http("POST", "/v1/workflows", Some(&token), &[b' '; (1 << 20) + 1]);
    assert_eq!(code((status, answer.clone())), (413, Some("too_large".to_owned())));
    assert!(message(&answer).contains("over 1048576 bytes"), "{answer}");
    let (status, answer) = server.http("POST", "/v1/components", Some(&token), &[0; 1025]);
    assert_eq!(code((status, answer.clone())), (413, Some("too_large".to_owned())));
    assert!(message(&answer).contains("over 1024 bytes") && message(&answer).contains("`--max-upload`"), "{answer}");

    // Routes that do not exist, and methods a route does not take.
    for path in ["/v2/workflows", "/v1/workflows/a/b/c", "/"] {
        let (status, answer) = server.http("GET", path, Some(&token), b"");
        assert_eq!(code((status, answer.clone())), (404, Some("not_found".to_owned())), "{path}: {answer}");
        assert!(message(&answer).contains("openapi.json"), "{answer}");
    }
    let (status, answer) = server.http("PUT", "/v1/workflows", Some(&token), b"");
    assert_eq!(code((status, answer)), (405, Some("method_not_allowed".to_owned())));
    // A path segment that is not UTF-8 once decoded.
    let (status, answer) = server.http("GET", "/v1/workflows/%FF", Some(&token), b"");
    assert_eq!(code((status, answer)), (400, Some("invalid".to_owned())));

    // And the server goes on.
    assert_eq!(server.http("GET", "/v1/workflows", Some(&token), b"").0, 200);
}

/// The schemathesis (PyPI) the API is fuzzed with: pinned, so that a new release's new
/// checks land as a change of this line and not as a failure out of nowhere.
const SCHEMATHESIS: &str = "4.32.5";

/// `schemathesis`: the one on `PATH` if it is [`SCHEMATHESIS`], else the one installed
/// once with pip under the target directory (never into the repository or the system).
fn schemathesis() -> Command {
    let on_path = Command::new("schemathesis").arg("--version").output();
    if on_path.is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(SCHEMATHESIS)) {
        return Command::new("schemathesis");
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("schemathesis-{SCHEMATHESIS}"));
    let script = dir.join("bin/schemathesis");
    if !script.exists() {
        // Installed aside and renamed once whole: an interrupted install is not taken
        // for a complete one.
        let partial = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
            .arg(&partial)
            .arg(format!("schemathesis=={SCHEMATHESIS}"))
            .stdin(Stdio::null())
            .status()
            .expect("python3 runs, to install schemathesis with pip");
        assert!(
            status.success(),
            "pip could not install schemathesis {SCHEMATHESIS} into {} ({status})",
            partial.display()
        );
        std::fs::rename(&partial, &dir).expect("the installed schemathesis is moved in place");
    }
    let mut command = Command::new("python3");
    command.arg(script).env("PYTHONPATH", &dir);
    command
}

/// Runs `command` to its end, at most `within`; its exit status and its output (stdout,
/// then stderr). Killed, and the test failed, past `within`.
fn bounded(mut command: Command, within: Duration) -> (std::process::ExitStatus, String) {
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("it starts");
    let (mut stdout, mut stderr) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let begun = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("its status") {
            break status;
        }
        if begun.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {within:?}, killed:\n{}{}", out.join().unwrap(), err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, format!("{}{}", out.join().expect("stdout read"), err.join().expect("stderr read")))
}

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_the_document_does_not_describe() {
    let dir = scratch("serve-schemathesis");
    let server = Server::start(&dir.join("data"));
    let token = server.tenant("acme");
    let hash = deploy_tour(&server, &token);
    // Data to reach past the 404s: one running, one completed, one failed.
    for (id, method, input) in [("w1", "deadline", "600000"), ("w2", "deadline", "1"), ("w3", "fails", "\"boom\"")] {
        let started = server.client(&token, &["start", "tour", "--id", id, "--method", method, "--input", input]);
        assert_eq!(started.code, 0, "{}", started.stderr);
    }
    for id in ["w2", "w3"] {
        assert_ne!(server.client(&token, &["result", id, "--wait", "20s"]).code, 4, "{id} ends");
    }
    // The real ids and names, used for about half the values schemathesis makes for them.
    let config = dir.join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            r#"[dictionaries.workflows]
values = ["w1", "w2", "w3"]
[dictionaries.components]
values = ["tour", "{hash}"]
[dictionaries.methods]
values = ["deadline", "echo", "fails"]
[dictionaries.inputs]
values = [1, 600000]
[dictionaries.tenants]
values = ["acme"]
[parameters]
"path.id" = {{ dictionary = "workflows", probability = 0.5 }}
"path.reference" = {{ dictionary = "components", probability = 0.5 }}
"path.name" = {{ dictionary = "tenants", probability = 0.3 }}
"query.component" = {{ dictionary = "components", probability = 0.5 }}
"body.component" = {{ dictionary = "components", probability = 0.8 }}
"body.method" = {{ dictionary = "methods", probability = 0.8 }}
"body.input" = {{ dictionary = "inputs", probability = 0.5 }}
"#
        ),
    )
    .expect("the configuration is written");

    // The tenant's routes with its token, then the admin's with the admin's (which may
    // rotate the tenant's token: last).
    let admin = server.admin_token();
    for (who, bearer, tags) in
        [("tenant", token.as_str(), ["components", "workflows"]), ("admin", admin.as_str(), ["tenants", "operations"])]
    {
        let run = || {
            let mut command = schemathesis();
            command.current_dir(&dir).arg("--no-color").arg("--config-file").arg(&config).args([
                "run",
                &format!("{}/v1/openapi.json", server.url()),
                "--header",
                &format!("Authorization: Bearer {bearer}"),
                "--include-tag",
                tags[0],
                "--include-tag",
                tags[1],
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,\
                 response_headers_conformance",
                "--max-examples",
                "30",
                "--seed",
                "1",
                "--workers",
                "2",
                // Past the longest `result?wait=` the server grants (60 s).
                "--request-timeout",
                "65",
            ]);
            // About 15 s each alone on 2 cores; the bound leaves room for a loaded machine.
            bounded(command, Duration::from_secs(300))
        };
        let (mut status, mut report) = run();
        // schemathesis can fail in its own Python (CPython's `ast` has raised "AST
        // constructor recursion depth mismatch" inside hypothesis): a runtime error of the
        // tool's with no finding about the server and no request that failed to connect.
        // Such a run is made once more; a finding, or the server gone, fails at once.
        if !status.success()
            && report.contains("Runtime Error")
            && !report.contains("FAILURES")
            && !report.contains("Network Error")
        {
            (status, report) = run();
        }
        assert!(status.success(), "schemathesis, as the {who}, found answers the document does not allow:\n{report}");
        assert!(report.contains("passed"), "schemathesis, as the {who}, ran no test:\n{report}");
    }
    assert_eq!(server.http("GET", "/healthz", None, b"").0, 200, "the server goes on");
}

/// Deploys `examples-wasm/counter` as `counter` for `token`.
fn deploy_counter(server: &Server, token: &str) {
    let deployed = server.client(token, &["deploy", COUNTER, "--name", "counter"]);
    assert_eq!(deployed.code, 0, "{}", deployed.stderr);
}

/// Starts `method` of the counter as workflow `id` with `input`.
fn start_counter(server: &Server, token: &str, id: &str, method: &str, input: &str) {
    let started = server.client(token, &["start", "counter", "--id", id, "--method", method, "--input", input]);
    assert_eq!(started.code, 0, "{}", started.stderr);
}

#[test]
fn a_request_is_answered_once_and_asking_again_gets_the_same_answer() {
    let server = Server::start(&scratch("serve-request"));
    let token = server.tenant("acme");
    deploy_counter(&server, &token);
    start_counter(&server, &token, "c", "counter", "1");

    let got = server.client(&token, &["request", "c", "get"]);
    assert_eq!((got.code, got.stdout.trim()), (0, "1"), "{}", got.stderr);
    let added = server.client(&token, &["request", "c", "add", r#"{"by": 5}"#, "--request-id", "r1"]);
    assert_eq!((added.code, added.stdout.trim()), (0, "6"), "{}", added.stderr);
    // The same id again: the same answer, and the request is not delivered twice.
    let again = server.client(&token, &["request", "c", "add", r#"{"by": 5}"#, "--request-id", "r1"]);
    assert_eq!((again.code, again.stdout.trim()), (0, "6"), "{}", again.stderr);
    assert_eq!(server.client(&token, &["request", "c", "get"]).stdout.trim(), "6");
    // Raw HTTP, the id in the `Idempotency-Key` header: the answer is the body.
    let (status, answer) = server.http_with(
        "POST",
        "/v1/workflows/c/request",
        Some(&token),
        "Idempotency-Key: r1\r\n",
        br#"{"topic": "add", "body": {"by": 5}}"#,
    );
    assert_eq!((status, answer), (200, json!(6)));
    // The same id with another body is another request: refused.
    let (status, answer) = server.http(
        "POST",
        "/v1/workflows/c/request",
        Some(&token),
        br#"{"id": "r1", "topic": "add", "body": {"by": 7}}"#,
    );
    assert_eq!((status, answer["error"]["code"].as_str()), (409, Some("conflict")), "{answer}");

    // The workflow answers with an error: exit code 1, its message on stderr.
    let refused = server.client(&token, &["request", "c", "launch"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("no such request `launch`"), "{}", refused.stderr);
    let (status, answer) =
        server.http("POST", "/v1/workflows/c/request", Some(&token), br#"{"topic": "add", "body": 3}"#);
    assert_eq!((status, answer["error"]["code"].as_str()), (422, Some("request_failed")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("is not a `Add`"), "{answer}");

    // Typed signals: a body of the wrong shape is skipped, a right one counted.
    assert_eq!(server.client(&token, &["signal", "c", "add", r#"{"by": "many"}"#]).code, 0);
    assert_eq!(server.client(&token, &["signal", "c", "add", r#"{"by": 4}"#]).code, 0);
    // A request may be taken before signals that came just before it: ask until they count.
    let begun = Instant::now();
    while server.client(&token, &["request", "c", "get"]).stdout.trim() != "10" {
        assert!(begun.elapsed() < HANG, "the signals were never counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nobody forges a request through a signal.
    let forged = server.http(
        "POST",
        "/v1/workflows/c/signal",
        Some(&token),
        br#"{"topic": "wasmproc:request:x:add", "body": {"by": 1}}"#,
    );
    assert_eq!(forged.0, 400, "{}", forged.1);

    assert_eq!(server.client(&token, &["signal", "c", "stop"]).code, 0);
    let result = server.client(&token, &["result", "c", "--wait", "20s"]);
    assert_eq!((result.code, result.stdout.trim()), (0, "10"), "{}", result.stderr);
    // Ended: the answer given is still there for its id; a new request is refused.
    let (status, answer) = server.http(
        "POST",
        "/v1/workflows/c/request",
        Some(&token),
        br#"{"id": "r1", "topic": "add", "body": {"by": 5}}"#,
    );
    assert_eq!((status, answer), (200, json!(6)));
    let late = server.client(&token, &["request", "c", "get"]);
    assert!(late.code == 2 && late.stderr.contains("(409)"), "{}", late.stderr);

    // Its id, as the workflow and its child see it.
    start_counter(&server, &token, "who", "whoami", "null");
    let who = server.client(&token, &["result", "who", "--wait", "20s"]);
    assert_eq!(who.stdout.trim(), r#"["who","who"]"#, "{}", who.stderr);
}

#[test]
fn a_request_to_a_workflow_that_ends_without_answering_fails_with_410() {
    let server = Server::start_with(&scratch("serve-unanswered"), &["--max-pending-requests", "1"]);
    let token = server.tenant("acme");
    deploy_counter(&server, &token);
    start_counter(&server, &token, "m", "mute", "null");
    let (status, answer) =
        server.http("POST", "/v1/workflows/m/request?timeout=20s", Some(&token), br#"{"id": "q", "topic": "hello"}"#);
    assert_eq!((status, answer["error"]["code"].as_str()), (410, Some("unanswered")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("without answering request `q`"), "{answer}");
    // Asked again: the same, at once; through the CLI, exit code 1.
    let again = server.client(&token, &["request", "m", "hello", "--request-id", "q"]);
    assert!(again.code == 1 && again.stderr.contains("without answering request `q`"), "{}", again.stderr);
    assert_eq!(server.client(&token, &["result", "m", "--wait", "20s"]).stdout.trim(), "\"hello\"");

    // One request unanswered is the most this server takes: the next is refused.
    start_counter(&server, &token, "s", "slow", "null");
    let (status, answer) = server.http(
        "POST",
        "/v1/workflows/s/request?timeout=10ms",
        Some(&token),
        br#"{"id": "long", "topic": "nap", "body": {"ms": 60000}}"#,
    );
    assert_eq!((status, &answer["request"]), (202, &json!({"id": "long", "state": "pending"})), "{answer}");
    let (status, answer) =
        server.http("POST", "/v1/workflows/s/request", Some(&token), br#"{"topic": "nap", "body": {"ms": 1}}"#);
    assert_eq!((status, answer["error"]["code"].as_str()), (429, Some("too_many_requests")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("`--max-pending-requests`"), "{answer}");
    let waited =
        server.client(&token, &["request", "s", "nap", r#"{"ms": 60000}"#, "--request-id", "long", "--timeout", "1s"]);
    assert!(waited.code == 4 && waited.stderr.contains("--request-id long"), "{}", waited.stderr);
    assert_eq!(server.client(&token, &["terminate", "s"]).code, 0);
    let (status, answer) = server.http(
        "POST",
        "/v1/workflows/s/request?timeout=20s",
        Some(&token),
        br#"{"id": "long", "topic": "nap", "body": {"ms": 60000}}"#,
    );
    assert_eq!((status, answer["error"]["code"].as_str()), (410, Some("unanswered")), "{answer}");
}

#[test]
fn a_request_survives_a_kill_9_of_the_server_delivered_and_answered_once() {
    let data = scratch("serve-request-restarts");
    let server = Server::start(&data);
    let token = server.tenant("acme");
    deploy_counter(&server, &token);
    start_counter(&server, &token, "s", "slow", "null");
    // Answered before the crash.
    let first = server.client(&token, &["request", "s", "nap", r#"{"ms": 1}"#, "--request-id", "early"]);
    assert_eq!((first.code, first.stdout.trim()), (0, "1"), "{}", first.stderr);
    // Delivered, and not answered before the crash: the workflow sleeps 2 s first.
    let (status, _) = server.http(
        "POST",
        "/v1/workflows/s/request?timeout=10ms",
        Some(&token),
        br#"{"id": "late", "topic": "nap", "body": {"ms": 2000}}"#,
    );
    assert_eq!(status, 202);
    server.kill();

    let server = Server::start(&data);
    let early = server.client(&token, &["request", "s", "nap", r#"{"ms": 1}"#, "--request-id", "early"]);
    assert_eq!((early.code, early.stdout.trim()), (0, "1"), "the answer given before the crash: {}", early.stderr);
    let late =
        server.client(&token, &["request", "s", "nap", r#"{"ms": 2000}"#, "--request-id", "late", "--timeout", "30s"]);
    assert_eq!((late.code, late.stdout.trim()), (0, "2"), "answered after the restart: {}", late.stderr);
    server.kill();

    // Once more across a crash: both answers stand, and each request was delivered once.
    let server = Server::start(&data);
    let late = server.client(&token, &["request", "s", "nap", r#"{"ms": 2000}"#, "--request-id", "late"]);
    assert_eq!(late.stdout.trim(), "2", "{}", late.stderr);
    assert_eq!(server.client(&token, &["signal", "s", "stop"]).code, 0);
    let result = server.client(&token, &["result", "s", "--wait", "20s"]);
    assert_eq!((result.code, result.stdout.trim()), (0, "2"), "two requests answered in all: {}", result.stderr);
}

/// `wasmproc logs ID -f` for `token`, running: its stdout's lines arrive on the receiver.
fn follow_logs(server: &Server, token: &str, id: &str) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut command = wasmproc(&["logs", id, "-f"]);
    command.env("WASMPROC_SERVER", server.url()).env("WASMPROC_TOKEN", token).stdin(Stdio::null());
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("the client runs");
    let stdout = child.stdout.take().expect("its stdout");
    let (lines_to, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_to.send(line);
        }
    });
    (child, lines)
}

#[test]
fn a_workflows_log_is_kept_bounded_and_followed_until_it_ends() {
    let data = scratch("serve-logs");
    let server = Server::start_with(&data, &["--max-log-bytes", "4KiB"]);
    let token = server.tenant("acme");
    deploy_counter(&server, &token);
    // Three lines of its own and one of its child's, then it waits for `stop`.
    start_counter(&server, &token, "ch", "chatty", "3");
    let begun = Instant::now();
    while !server.client(&token, &["logs", "ch"]).stdout.contains("a child's line") {
        assert!(begun.elapsed() < HANG, "the child's line never reached the log");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut follower, lines) = follow_logs(&server, &token, "ch");
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(lines.recv_timeout(HANG).expect("the kept lines, first"));
    }
    assert_eq!(server.client(&token, &["signal", "ch", "stop"]).code, 0);
    // The follower ends by itself once the workflow has, with its last line.
    let ended = Instant::now();
    while follower.try_wait().expect("the follower's state").is_none() {
        assert!(ended.elapsed() < HANG, "`logs -f` outlived its workflow");
        std::thread::sleep(Duration::from_millis(50));
    }
    seen.extend(lines.try_iter());
    let root = json_out(&server.client(&token, &["status", "ch", "--json"]))["workflow"]["pid"].to_string();
    let expected = [
        format!("[pid {root}] info: line 0 of 3"),
        format!("[pid {root}] info: line 1 of 3"),
        format!("[pid {root}] info: line 2 of 3"),
    ];
    assert_eq!(seen[..3], expected, "{seen:?}");
    assert!(seen[3].ends_with("info: a child's line") && !seen[3].starts_with(&format!("[pid {root}]")), "{seen:?}");
    assert_eq!(seen.get(4).map(String::as_str), Some(format!("[pid {root}] info: bye").as_str()), "{seen:?}");
    assert_eq!(seen.len(), 5, "{seen:?}");
    // Raw: newline-delimited JSON.
    let raw = server.exchange("GET", "/v1/workflows/ch/logs", Some(&token), b"");
    assert!(raw.to_ascii_lowercase().contains("content-type: application/x-ndjson"), "{raw}");

    // 200 lines of some 80 bytes: past the 4 KiB bound, the oldest go, and a marker says
    // how many.
    start_counter(&server, &token, "many", "chatty", "200");
    let begun = Instant::now();
    let kept = loop {
        let kept = server.client(&token, &["logs", "many", "--json"]);
        if kept.stdout.contains("a child's line") {
            break kept;
        }
        assert!(begun.elapsed() < HANG, "the child's line never reached the log");
        std::thread::sleep(Duration::from_millis(50));
    };
    let kept: Vec<Value> = kept.stdout.lines().map(|l| serde_json::from_str(l).expect("JSON lines")).collect();
    let dropped = kept[0]["dropped"].as_u64().expect("a marker first");
    assert!(kept[0]["message"].as_str().unwrap().contains("`--max-log-bytes`"), "{}", kept[0]);
    let lines: Vec<&str> = kept[1..].iter().filter_map(|l| l["message"].as_str()).collect();
    assert_eq!(dropped as usize + lines.len(), 201, "every line kept or counted: {lines:?}");
    assert_eq!(lines[lines.len() - 2..], ["line 199 of 200", "a child's line"]);
    let on_disk: u64 = ["many.log", "many.log.1"]
        .iter()
        .map(|f| std::fs::metadata(data.join("logs/acme").join(f)).map_or(0, |m| m.len()))
        .sum();
    assert!(on_disk <= 4096, "{on_disk} bytes on disk");
    // Its text form says so on stderr.
    let shown = server.client(&token, &["logs", "many"]);
    assert!(shown.stderr.contains(&format!("{dropped} older lines were dropped")), "{}", shown.stderr);

    // Forgotten, its log goes with it.
    assert_eq!(server.client(&token, &["forget", "ch"]).code, 0);
    assert!(
        !data.join("logs/acme/ch.log").exists() || {
            std::thread::sleep(Duration::from_millis(500));
            !data.join("logs/acme/ch.log").exists()
        }
    );
    assert_eq!(server.http("GET", "/v1/workflows/ch/logs", Some(&token), b"").0, 404);
}

#[test]
fn a_workflows_description_shows_its_steps_and_its_timer() {
    let server = Server::start(&scratch("serve-describe"));
    let token = server.tenant("acme");
    deploy_counter(&server, &token);
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    start_counter(&server, &token, "n", "nap", "600000");
    let begun = Instant::now();
    let described = loop {
        let described = json_out(&server.client(&token, &["status", "n", "--json"]));
        if described["workflow"]["waiting"][0]["for"] == "timer" {
            break described;
        }
        assert!(begun.elapsed() < HANG, "never seen waiting on its timer: {described}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let w = &described["workflow"];
    assert!(w["steps"].as_u64() >= Some(1), "{w}");
    let until = w["waiting"][0]["until_ms"].as_u64().expect("when the timer fires");
    assert!((before + 600_000..before + 600_000 + 60_000).contains(&until), "{until} vs {before}: {w}");
    let shown = server.client(&token, &["status", "n"]);
    assert!(shown.stdout.contains("waits for a timer, until 20"), "{}", shown.stdout);

    // Waiting for its requests: a message.
    start_counter(&server, &token, "c", "counter", "0");
    let begun = Instant::now();
    while json_out(&server.client(&token, &["status", "c", "--json"]))["workflow"]["waiting"]
        != json!([{"for": "message"}])
    {
        assert!(begun.elapsed() < HANG, "never seen waiting for a message");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Ended: its steps, and nothing it waits for.
    assert_eq!(server.client(&token, &["terminate", "n"]).code, 0);
    server.client(&token, &["result", "n", "--wait", "20s"]);
    let ended = json_out(&server.client(&token, &["status", "n", "--json"]));
    assert!(ended["workflow"]["steps"].as_u64() >= Some(1) && ended["workflow"]["waiting"].is_null(), "{ended}");
}

/// Asserts that the server refused a client command with `status`: its exit code is 2,
/// and its stderr names the status and says `words`.
fn refused(ran: &Ran, status: u16, words: &str) {
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains(&format!("({status})")) && ran.stderr.contains(words), "{}", ran.stderr);
}

#[test]
fn a_tenants_policy_bounds_what_its_workflows_are_granted() {
    let server = Server::start(&scratch("serve-policy"));
    let admin = server.admin_token();
    let acme = server.tenant("acme");
    let added =
        server.client(&admin, &["tenant", "add", "globex", "--kv", "--allow", "terminate", "--memory", "16MiB"]);
    assert_eq!(added.code, 0, "{}", added.stderr);
    let globex = added.stdout.trim().to_owned();
    let listed = server.client(&admin, &["tenant", "ls"]);
    assert!(
        listed.stdout.contains("acme  allow=-  kv=no  max-running=10000  memory=64MiB  storage=1GiB  rate=1000/s")
            && listed.stdout.contains("globex  allow=terminate  kv=yes  max-running=10000  memory=16MiB"),
        "{}",
        listed.stdout
    );
    deploy_tour(&server, &acme);
    deploy_tour(&server, &globex);

    // Beyond acme's policy: refused, naming the bound and the admin's fix.
    let start = |token: &str, id: &str, extra: &[&str]| {
        let mut args = vec!["start", "tour", "--id", id, "--method", "deadline", "--input", "1"];
        args.extend_from_slice(extra);
        server.client(token, &args)
    };
    refused(&start(&acme, "a", &["--kv"]), 403, "`wasmproc tenant policy acme --kv`");
    refused(&start(&acme, "a", &["--allow", "terminate"]), 403, "`wasmproc tenant policy acme --allow terminate`");
    refused(&start(&acme, "a", &["--memory", "128MiB"]), 403, "beyond tenant `acme`'s policy (at most 67108864 bytes)");
    let (status, answer) = server.http(
        "POST",
        "/v1/workflows",
        Some(&acme),
        br#"{"component": "tour", "method": "deadline", "grants": {"kv": true}}"#,
    );
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("beyond_policy")), "{answer}");
    refused(&start(&globex, "g", &["--memory", "32MiB"]), 403, "at most 16777216 bytes");

    // Within its policy: started, with what it asked recorded.
    let started = start(&globex, "g", &["--kv", "--allow", "terminate", "--memory", "8MiB", "--json"]);
    assert_eq!(started.code, 0, "{}", started.stderr);
    let w = &json_out(&started)["workflow"];
    assert_eq!((&w["grants"], &w["limits"]["memory"]), (&json!({"allow": ["terminate"], "kv": true}), &json!(8 << 20)));
    // The same request again is the same workflow; other grants or limits are another.
    assert_eq!(start(&globex, "g", &["--allow", "terminate", "--kv", "--memory", "8MiB"]).code, 0);
    refused(&start(&globex, "g", &["--kv", "--allow", "terminate"]), 409, "workflow `g` exists");
    refused(&start(&globex, "g", &["--allow", "terminate", "--memory", "8MiB"]), 409, "workflow `g` exists");

    // The memory limit holds: a Rust guest needs more than one page to start.
    refused(&start(&globex, "tiny", &["--memory", "64KiB"]), 422, "did not start");

    // The admin widens acme's policy; then what was refused starts.
    let widened = server.client(&admin, &["tenant", "policy", "acme", "--kv", "--max-running", "7"]);
    assert!(widened.stdout.contains("acme  allow=-  kv=yes  max-running=7  memory=64MiB"), "{}", widened.stdout);
    assert_eq!(start(&acme, "a", &["--kv"]).code, 0);
    let (status, answer) = server.http("GET", "/v1/tenants/acme/policy", Some(&admin), b"");
    assert_eq!((status, &answer["policy"]["kv"], &answer["policy"]["max_running"]), (200, &json!(true), &json!(7)));
    // A policy past what the server holds is refused, and changes nothing.
    let (status, answer) = server.http("PUT", "/v1/tenants/acme/policy", Some(&admin), br#"{"memory": 1099511627776}"#);
    assert!(status == 400 && answer["error"]["message"].as_str().unwrap().contains("`--memory`"), "{answer}");
    let bad = server.client(&admin, &["tenant", "policy", "acme", "--allow", "spawn"]);
    refused(&bad, 400, "not `spawn`");
    assert_eq!(server.http("GET", "/v1/tenants/nobody/policy", Some(&admin), b"").0, 404);
    assert_eq!(server.http("GET", "/v1/tenants/acme/policy", Some(&admin), b"").1["policy"]["max_running"], 7);
}

#[test]
fn a_tenants_key_value_store_is_shared_by_its_workflows_and_no_one_elses() {
    let data = scratch("serve-kv");
    let mut server = Server::start_with(&data, &["--kv"]);
    let (acme, globex) = (server.tenant("acme"), server.tenant("globex"));
    deploy_tour(&server, &acme);
    deploy_tour(&server, &globex);
    let run = |server: &Server, token: &str, id: &str, method: &str, input: &str, extra: &[&str]| {
        let mut args = vec!["start", "tour", "--id", id, "--method", method, "--input", input];
        args.extend_from_slice(extra);
        let started = server.client(token, &args);
        assert_eq!(started.code, 0, "{}", started.stderr);
        server.client(token, &["result", id, "--wait", "20s"])
    };
    let wrote = run(&server, &acme, "w", "remember", r#"["colour", "blue"]"#, &["--kv"]);
    assert_eq!(wrote.code, 0, "{}", wrote.stderr);
    // Another workflow of acme's reads it; globex's, the same key in its own store, nothing.
    assert_eq!(run(&server, &acme, "r1", "recall", r#""colour""#, &["--kv"]).stdout.trim(), "\"blue\"");
    assert_eq!(run(&server, &globex, "r1", "recall", r#""colour""#, &["--kv"]).stdout.trim(), "null");
    // Without `--kv` a workflow has no store at all.
    let ungranted = run(&server, &acme, "r2", "recall", r#""colour""#, &[]);
    assert!(ungranted.code == 1 && ungranted.stderr.contains("kv.get"), "{}", ungranted.stderr);

    // Across a `kill -9` and a restart, the stores are as they were, each its tenant's.
    server.kill();
    server = Server::start_with(&data, &["--kv"]);
    assert_eq!(run(&server, &acme, "r3", "recall", r#""colour""#, &["--kv"]).stdout.trim(), "\"blue\"");
    assert_eq!(run(&server, &globex, "r3", "recall", r#""colour""#, &["--kv"]).stdout.trim(), "null");
    let theirs = run(&server, &globex, "w", "remember", r#"["colour", "red"]"#, &["--kv"]);
    assert_eq!(theirs.code, 0, "{}", theirs.stderr);
    assert_eq!(run(&server, &acme, "r4", "recall", r#""colour""#, &["--kv"]).stdout.trim(), "\"blue\"");

    // The storage quota counts the components and the data together.
    let tour = std::fs::metadata(SDK_TOUR).expect("the tour").len();
    let admin = server.admin_token();
    let storage = (tour + 20).to_string();
    assert_eq!(server.client(&admin, &["tenant", "policy", "acme", "--storage", &storage]).code, 0);
    let big = json!(["big", "x".repeat(64)]).to_string();
    let full = run(&server, &acme, "big", "remember", &big, &["--kv"]);
    assert!(
        full.code == 1 && full.stderr.contains("tenant `acme`'s `storage`") && full.stderr.contains("--storage"),
        "{}",
        full.stderr
    );
    let again = server.http("POST", "/v1/components?name=other", Some(&acme), &[0; 32]);
    assert_eq!((again.0, again.1["error"]["code"].as_str()), (413, Some("quota")), "{}", again.1);
}

#[test]
fn a_component_is_removed_once_no_running_workflow_uses_it() {
    let server = Server::start(&scratch("serve-undeploy"));
    let acme = server.tenant("acme");
    let hash = deploy_tour(&server, &acme);
    let tagged = server.client(&acme, &["deploy", SDK_TOUR, "--name", "tour", "--tag", "v1", "--json"]);
    let described = json_out(&server.client(&acme, &["deploy", SDK_TOUR, "--json"]));
    assert_eq!(tagged.code, 0, "{}", tagged.stderr);
    let names = &described["component"]["names"];
    assert!(names.as_array().is_some_and(|n| n.contains(&json!("tour")) && n.contains(&json!("tour:v1"))), "{names}");
    let (status, answer) = server.http("GET", "/v1/components/tour:v1", Some(&acme), b"");
    assert_eq!((status, &answer["component"]["hash"]), (200, &json!(hash)));
    let entries = &answer["component"]["entries"];
    assert!(entries.as_array().is_some_and(|e| e.contains(&json!("remember"))), "{entries}");
    assert_eq!(answer["component"]["commands"], json!(["kv.get", "kv.put"]), "{answer}");

    assert_eq!(
        server.client(&acme, &["start", "tour", "--id", "busy", "--method", "deadline", "--input", "60000"]).code,
        0
    );
    refused(&server.client(&acme, &["undeploy", "tour:v1"]), 409, "runs in workflows `busy`");
    assert_eq!(server.client(&acme, &["terminate", "busy"]).code, 0);
    assert_eq!(server.client(&acme, &["result", "busy", "--wait", "20s"]).code, 1);
    let removed = server.client(&acme, &["undeploy", &hash]);
    assert_eq!((removed.code, removed.stdout.trim()), (0, format!("removed {hash}").as_str()), "{}", removed.stderr);
    for reference in [hash.as_str(), "tour", "tour:v1"] {
        let (status, _) = server.http("GET", &format!("/v1/components/{reference}"), Some(&acme), b"");
        assert_eq!(status, 404, "{reference}");
    }
    refused(&server.client(&acme, &["start", "tour", "--method", "deadline", "--input", "1"]), 404, "no component");
    assert!(!server.data.join("components").join(format!("{}.wasm", &hash["sha256:".len()..])).exists());
    // Its ended workflow's history is still there.
    assert_eq!(server.http("GET", "/v1/workflows/busy/history", Some(&acme), b"").0, 200);
}

/// The HTTP hosts and the directories a workflow may be granted lie within its tenant's
/// policy: granted within it, a workflow fetches from a local server and writes its
/// notes; past it, the start is refused (403) naming the admin's fix; a directory granted
/// to read is not written; and nothing of it is granted unless asked for.
#[test]
fn a_tenants_policy_bounds_the_hosts_and_directories_its_workflows_are_granted() {
    let dir = scratch("serve-outside");
    let (site, shared, elsewhere) = (dir.join("site"), dir.join("shared"), dir.join("elsewhere"));
    for made in [&site, &shared.join("notes"), &elsewhere] {
        std::fs::create_dir_all(made).expect("a directory");
    }
    std::fs::write(site.join("index.html"), "hello from the server").expect("a page");
    let page = Site::start(&site);
    let host = format!("127.0.0.1:{}", page.port());
    let url = json!({ "url": format!("http://{host}/index.html") }).to_string();
    let shared_arg = shared.to_str().expect("a UTF-8 path");
    let server =
        Server::start_with(&dir.join("data"), &["--kv", "--allow-host", "127.0.0.1:*", "--dir-rw", shared_arg]);
    let admin = server.admin_token();
    let acme = server.tenant("acme");
    let listed = server.client(&admin, &["tenant", "ls"]);
    assert!(listed.stdout.contains(&format!("hosts=127.0.0.1:*  dirs-rw={shared_arg}")), "{}", listed.stdout);
    for (guest, name) in [(FETCHER, "fetcher"), (NOTES, "notes")] {
        let deployed = server.client(&acme, &["deploy", guest, "--name", name]);
        assert_eq!(deployed.code, 0, "{}", deployed.stderr);
    }
    let result = |id: &str| server.client(&acme, &["result", id, "--wait", "30s", "--json"]);

    // Hosts: within the policy, fetched; past it, refused; not asked for, denied.
    let fetched =
        server.client(&acme, &["start", "fetcher", "--id", "f1", "--kv", "--allow-host", &host, "--input", &url]);
    assert_eq!(fetched.code, 0, "{}", fetched.stderr);
    let answer = json_out(&result("f1"));
    assert_eq!(answer["workflow"]["result"]["ok"], json!({"status": 200, "bytes": 21, "fetches": 1}), "{answer}");
    let past = server
        .client(&acme, &["start", "fetcher", "--id", "f2", "--kv", "--allow-host", "example.com", "--input", &url]);
    refused(&past, 403, "`wasmproc tenant policy acme --allow-host example.com`");
    let ungranted = server.client(&acme, &["start", "fetcher", "--id", "f3", "--kv", "--input", &url]);
    assert_eq!(ungranted.code, 0, "{}", ungranted.stderr);
    let answer = json_out(&result("f3"));
    assert_eq!(answer["workflow"]["state"], "failed", "{answer}");
    assert!(
        answer["workflow"]["result"]["error"]["message"].as_str().unwrap_or("").contains("http.request"),
        "{answer}"
    );

    // Directories: granted to write within the policy, written; granted to read, not.
    let notes = format!("{}::/notes", shared.join("notes").display());
    let added = server.client(
        &acme,
        &["start", "notes", "--id", "n1", "--method", "add", "--input", "\"apples\"", "--dir-rw", &notes],
    );
    assert_eq!(added.code, 0, "{}", added.stderr);
    assert_eq!(json_out(&result("n1"))["workflow"]["result"]["ok"], 1);
    assert_eq!(std::fs::read_to_string(shared.join("notes/notes.txt")).expect("the notes"), "apples\n");
    let read_only = server
        .client(&acme, &["start", "notes", "--id", "n2", "--method", "add", "--input", "\"pears\"", "--dir", &notes]);
    assert_eq!(read_only.code, 0, "{}", read_only.stderr);
    assert_eq!(json_out(&result("n2"))["workflow"]["state"], "failed");
    assert_eq!(std::fs::read_to_string(shared.join("notes/notes.txt")).expect("the notes"), "apples\n");
    let outside = format!("{}::/notes", elsewhere.display());
    let past = server.client(
        &acme,
        &["start", "notes", "--id", "n3", "--method", "add", "--input", "\"figs\"", "--dir-rw", &outside],
    );
    refused(&past, 403, &format!("`wasmproc tenant policy acme --dir-rw {}`", elsewhere.display()));
    // A link inside the policy's directory that leads out of it is no way out.
    std::os::unix::fs::symlink(&elsewhere, shared.join("out")).expect("a link");
    let through = format!("{}::/notes", shared.join("out").display());
    let (status, answer) = server.http(
        "POST",
        "/v1/workflows",
        Some(&acme),
        json!({"component": "notes", "method": "add", "input": "figs", "grants": {"dirs_rw": [through]}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("beyond_policy")), "{answer}");
    let (status, answer) = server.http(
        "POST",
        "/v1/workflows",
        Some(&acme),
        br#"{"component": "notes", "method": "add", "input": "figs", "grants": {"dirs": ["notes::/notes"]}}"#,
    );
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid")), "{answer}");

    // The admin narrows acme's policy: what was granted before is refused now.
    let narrowed =
        server.client(&admin, &["tenant", "policy", "acme", "--deny-host", "127.0.0.1:*", "--no-dir", shared_arg]);
    assert_eq!(narrowed.code, 0, "{}", narrowed.stderr);
    let again =
        server.client(&acme, &["start", "fetcher", "--id", "f4", "--kv", "--allow-host", &host, "--input", &url]);
    refused(&again, 403, "no HTTP host");
    let again = server.client(
        &acme,
        &["start", "notes", "--id", "n4", "--method", "add", "--input", "\"kiwis\"", "--dir-rw", &notes],
    );
    refused(&again, 403, "no directory for `dirs_rw`");
}

/// A tenant's `max_processes` counts its workflows' processes, children to any depth
/// included, across a `kill -9` of the server: past it a start is refused (429) and a
/// workflow's spawn fails, naming the quota; as processes end there is room again.
#[test]
fn a_tenants_live_processes_are_bounded_children_included_across_restarts() {
    let data = scratch("serve-processes");
    let mut server = Server::start_with(&data, &["--max-processes", "3"]);
    let acme = server.tenant("acme");
    deploy_tour(&server, &acme);
    let start = |server: &Server, id: &str, method: &str, input: &str| {
        server.client(&acme, &["start", "tour", "--id", id, "--method", method, "--input", input])
    };
    // Two processes: the root and its linked child, waiting an hour.
    assert_eq!(start(&server, "pair", "linked_pair", "3600000").code, 0);
    // A third: its root fits, its child does not.
    assert_eq!(start(&server, "second", "linked_pair", "3600000").code, 0);
    let ended = json_out(&server.client(&acme, &["result", "second", "--wait", "30s", "--json"]));
    let message = ended["workflow"]["result"]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("process quota (3)") && message.contains("tenant `acme`"), "{ended}");
    assert_eq!(start(&server, "third", "race", "[3600000]").code, 0);
    refused(&start(&server, "fourth", "race", "[0]"), 429, "`wasmproc tenant policy acme --max-processes N`");

    // The next server counts the resumed processes as the last did.
    server.kill();
    server = Server::start_with(&data, &["--max-processes", "3"]);
    refused(&start(&server, "fourth", "race", "[0]"), 429, "3 processes alive");
    // Ending a root ends its linked child: room for a workflow of two.
    assert_eq!(server.client(&acme, &["terminate", "pair"]).code, 0);
    let ended = server.client(&acme, &["result", "pair", "--wait", "30s"]);
    assert_ne!(ended.code, 0, "terminated: {}", ended.stdout);
    let room = Instant::now();
    loop {
        let started = start(&server, "fourth", "race", "[0]");
        if started.code == 0 {
            break;
        }
        // The child's end follows its root's by a moment.
        assert!(room.elapsed() < HANG, "no room after the pair ended: {}", started.stderr);
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = server.client(&acme, &["result", "fourth", "--wait", "30s"]);
    assert_eq!((result.code, result.stdout.trim()), (0, "0"), "{}", result.stderr);
}
