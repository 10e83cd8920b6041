//! `wasmproc serve` and its client commands, against the real server on loopback: the
//! life of a workflow, idempotent starts, cancel and terminate, tenants kept apart, bad
//! requests, and a sleeping workflow carried across `kill -9` restarts of the server.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc_tests::HANG;
use wasmproc_tests::guests::SDK_TOUR;

use super::{Ran, finish, scratch, wasmproc};

/// A `wasmproc serve` on a free loopback port, killed (SIGKILL) when dropped.
struct Server {
    child: Child,
    address: String,
    data: PathBuf,
}

impl Server {
    fn start(data: &Path) -> Server {
        Server::start_with(data, &[])
    }

    fn start_with(data: &Path, flags: &[&str]) -> Server {
        let data_arg = data.to_str().expect("a UTF-8 path");
        let mut args = vec!["serve", "--data", data_arg, "--listen", "127.0.0.1:0", "--grace", "1s"];
        args.extend_from_slice(flags);
        let mut child = wasmproc(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the server starts");
        let stderr = child.stderr.take().expect("its stderr");
        let (found, address) = std::sync::mpsc::channel();
        // Reads stderr to its end, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("listening on http://") {
                    let rest = &line[at + "listening on http://".len()..];
                    let _ = found.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
                }
            }
        });
        let address = address.recv_timeout(HANG).expect("the server says where it listens");
        Server { child, address, data: data.to_owned() }
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data.join("admin.token")).expect("the admin token").trim().to_owned()
    }

    /// A client command against this server with `token`.
    fn client(&self, token: &str, args: &[&str]) -> Ran {
        let url = self.url();
        let mut command = wasmproc(args);
        command.env("WASMPROC_SERVER", url).env("WASMPROC_TOKEN", token).stdin(Stdio::null());
        finish(command.output().expect("the client runs"))
    }

    /// Adds tenant `name`; its token.
    fn tenant(&self, name: &str) -> String {
        let added = self.client(&self.admin_token(), &["tenant", "add", name]);
        assert_eq!(added.code, 0, "{}", added.stderr);
        added.stdout.trim().to_owned()
    }

    /// A raw request: its status and JSON body.
    fn http(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, Value) {
        let answer = self.exchange(method, path, token, body);
        let status =
            answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer:?}"));
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    /// A raw request's body, as text.
    fn raw(&self, method: &str, path: &str, token: Option<&str>) -> String {
        let answer = self.exchange(method, path, token, b"");
        answer.split_once("\r\n\r\n").map_or(String::new(), |(_, body)| body.to_owned())
    }

    /// A request over a connection of its own: the whole answer, head and body.
    fn exchange(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> String {
        let mut stream = TcpStream::connect(&self.address).expect("the server accepts");
        stream.set_read_timeout(Some(HANG)).expect("a read timeout");
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.address,
            body.len()
        );
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).expect("the request is sent");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("an answer");
        answer
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Deploys the SDK tour as `tour` for `token`.
fn deploy_tour(server: &Server, token: &str) -> String {
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

    // Every endpoint with acme's ids, as globex: not found, as if it did not exist.
    for (method, path, body) in [
        ("GET", "/v1/workflows/secret".to_owned(), ""),
        ("GET", "/v1/workflows/secret/result".to_owned(), ""),
        ("POST", "/v1/workflows/secret/signal".to_owned(), r#"{"topic":"go"}"#),
        ("POST", "/v1/workflows/secret/cancel".to_owned(), ""),
        ("POST", "/v1/workflows/secret/terminate".to_owned(), ""),
        ("DELETE", "/v1/workflows/secret".to_owned(), ""),
        ("GET", format!("/v1/components/{hash}"), ""),
        ("GET", "/v1/components/tour".to_owned(), ""),
    ] {
        let (status, answer) = server.http(method, &path, Some(&globex), body.as_bytes());
        assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("not_found")), "{method} {path}: {answer}");
    }
    // Nor start acme's component, by hash or by name.
    for component in [hash.as_str(), "tour"] {
        let body = json!({"component": component, "method": "deadline", "input": 1}).to_string();
        assert_eq!(server.http("POST", "/v1/workflows", Some(&globex), body.as_bytes()).0, 404, "{component}");
    }
    assert_eq!(server.http("GET", "/v1/workflows", Some(&globex), b"").1["workflows"], json!([]));
    assert_eq!(server.http("GET", "/v1/components", Some(&globex), b"").1["components"], json!([]));
    // Acme's workflow was not touched.
    assert_eq!(json_out(&server.client(&acme, &["status", "secret", "--json"]))["workflow"]["state"], "running");
    // Tokens: none, unknown, or the admin's are not a tenant's; a tenant's is not the admin's.
    assert_eq!(server.http("GET", "/v1/workflows", None, b"").0, 401);
    assert_eq!(server.http("GET", "/v1/workflows", Some("wpt_nobody"), b"").0, 401);
    assert_eq!(server.http("GET", "/v1/workflows", Some(&server.admin_token()), b"").0, 401);
    assert_eq!(server.http("GET", "/v1/tenants", Some(&acme), b"").0, 403);
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
    assert!(answer["error"]["message"].as_str().unwrap().contains("`--max-running`"), "{answer}");
    // Past 5 requests a second: refused, naming the flag; another tenant is not.
    let refused = (0..30)
        .map(|_| server.http("GET", "/v1/workflows", Some(&acme), b""))
        .find(|(status, _)| *status == 429)
        .expect("a burst past the rate is refused");
    assert_eq!(refused.1["error"]["code"], "rate", "{}", refused.1);
    assert!(refused.1["error"]["message"].as_str().unwrap().contains("`--rate`"), "{}", refused.1);
    assert_eq!(server.http("GET", "/v1/workflows", Some(&globex), b"").0, 200);
}
