//! The console (`wasmproc serve`'s `/ui`), in a real headless browser: Debian's
//! `chromium` driven through WebDriver by its `chromedriver` (both installed by
//! `.ci/run`; see [`wasmproc_tests::browser`]), against the real server on loopback. What the page shows is checked
//! against what the API answers; screenshots are kept under the target directory (the
//! test prints where). Also the routes the console reads, through plain HTTP.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc_tests::HANG;
use wasmproc_tests::browser::Browser;

use super::scratch;
use super::service::{Server, deploy_tour};

fn start(server: &Server, token: &str, id: &str, method: &str, input: Value) {
    let body = json!({"id": id, "component": "tour", "method": method, "input": input}).to_string();
    let (status, answer) = server.http("POST", "/v1/workflows", Some(token), body.as_bytes());
    assert_eq!(status, 201, "{answer}");
}

fn api(server: &Server, token: &str, path: &str) -> Value {
    let (status, answer) = server.http("GET", path, Some(token), b"");
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

/// Signs in through the login form with `token`, and waits for the workflows' table.
fn sign_in(browser: &Browser, url: &str, token: &str) {
    browser.go(&format!("{url}/ui"));
    browser.type_into("#token", token);
    browser.click("#login-form button[type=submit]");
    browser.wait("the workflows", "return document.getElementById('workflows').dataset.loaded;", json!([]));
}

/// The ids the table shows, in order.
fn rows(browser: &Browser) -> Vec<String> {
    let ids =
        browser.js("return [...document.querySelectorAll('#wf-rows tr[data-id]')].map(r => r.dataset.id);", json!([]));
    serde_json::from_value(ids).expect("ids")
}

/// Waits until the table has been loaded again after `since` loads.
fn reloaded(browser: &Browser, since: &Value) {
    browser.wait(
        "the workflows again",
        "const n = document.getElementById('workflows').dataset.loaded; return n !== arguments[0] && n;",
        json!([since]),
    );
}

#[test]
fn the_console_shows_and_controls_a_tenants_workflows_in_a_real_browser() {
    let dir = scratch("console-browser");
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let server = Server::start(&dir.join("data"));
    let (acme, globex) = (server.tenant("acme"), server.tenant("globex"));
    deploy_tour(&server, &acme);
    // A tree (a parent waiting on a child that waits to be cancelled), one waiting for a
    // signal under a timeout, one that logs, one already ended.
    start(&server, &acme, "tree", "parent_of_deaf", Value::Null);
    start(&server, &acme, "waiter", "deadline", json!(60_000));
    start(&server, &acme, "talker", "chatty", json!("console"));
    start(&server, &acme, "short", "deadline", json!(1));
    for ended in ["talker", "short"] {
        let (status, answer) = server.http("GET", &format!("/v1/workflows/{ended}/result?wait=20s"), Some(&acme), b"");
        assert_eq!(status, 200, "{ended}: {answer}");
    }
    // The tree's child is spawned once the parent has taken its first step.
    let begun = Instant::now();
    while api(&server, &acme, "/v1/workflows/tree/history")["processes"].as_array().map_or(0, Vec::len) < 2 {
        assert!(begun.elapsed() < HANG, "the tree's child was not spawned within {HANG:?}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let browser = Browser::start(&shots, &dir.join("profile"));
    let url = server.url();

    // Nothing but the login form before a token; every control has a name a screen
    // reader can say.
    browser.go(&format!("{url}/ui"));
    browser.wait("the login form", "return !document.getElementById('login').hidden;", json!([]));
    let unnamed = browser.js(
        "return [...document.querySelectorAll('input, select, button')].filter(e => \
           !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim()).map(e => e.id);",
        json!([]),
    );
    assert_eq!(unnamed, json!([]), "controls without a name");
    sign_in(&browser, &url, &acme);
    let token_in_url = browser.js("return location.href.includes(arguments[0]);", json!([acme]));
    assert_eq!(token_in_url, json!(false));

    // The table: every workflow, with its state as the API has it; the counts as the API
    // counts.
    let listed = api(&server, &acme, "/v1/workflows?progress=true");
    let mut expected: Vec<String> =
        listed["workflows"].as_array().unwrap().iter().map(|w| w["id"].as_str().unwrap().to_owned()).collect();
    expected.sort();
    assert_eq!(rows(&browser), expected);
    for workflow in listed["workflows"].as_array().unwrap() {
        let id = workflow["id"].as_str().unwrap();
        let shown = browser.text(&format!("#wf-rows tr[data-id='{id}'] .state"));
        assert_eq!(shown, workflow["state"].as_str().unwrap(), "{id}'s state");
    }
    let counts = api(&server, &acme, "/v1/workflow-counts");
    assert_eq!(counts, json!({"running": 2, "completed": 2, "failed": 0, "exact": true}));
    for state in ["running", "completed", "failed"] {
        let shown = browser.js(
            "return Number(document.querySelector(`#counts button[data-state=${arguments[0]}]`).dataset.count);",
            json!([state]),
        );
        assert_eq!(shown, counts[state], "the count of {state}");
    }
    let waiting = browser.text("#wf-rows tr[data-id='waiter'] td:last-child");
    assert!(waiting.contains("timer until"), "what `waiter` waits for: {waiting:?}");
    browser.screenshot("workflows");

    // Found by its id's prefix, through the filter form.
    let loads = browser.js("return document.getElementById('workflows').dataset.loaded;", json!([]));
    browser.type_into("#f-prefix", "tr");
    browser.click("#filters button[type=submit]");
    reloaded(&browser, &loads);
    assert_eq!(rows(&browser), ["tree"]);

    // The tree: its processes as the history has them, and a timeline of their records.
    browser.click("#wf-rows tr[data-id='tree'] a");
    browser.wait("the tree's page", "return document.getElementById('workflow').dataset.loaded;", json!([]));
    let history = api(&server, &acme, "/v1/workflows/tree/history");
    let pids: Vec<u64> = history["processes"].as_array().unwrap().iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    let shown = browser.wait(
        "both processes of the tree",
        "const p = [...document.querySelectorAll('#wf-tree li[data-pid]')].map(l => Number(l.dataset.pid)); \
         return p.length >= 2 && p;",
        json!([]),
    );
    assert_eq!(shown, json!(pids));
    let nested = browser.js("return Number(document.querySelector('#wf-tree > li > ul > li').dataset.pid);", json!([]));
    assert_eq!(nested, json!(pids[1]), "the child is under its parent");
    let records: usize =
        history["processes"].as_array().unwrap().iter().map(|p| p["records"].as_array().unwrap().len()).sum();
    let marks = browser
        .js("return document.querySelectorAll('#wf-chart rect.tl-step, #wf-chart rect.tl-exit').length;", json!([]));
    assert_eq!(marks, json!(records), "a mark on the timeline for each record");
    let rows_shown = browser.js("return document.querySelectorAll('#wf-records tbody tr').length;", json!([]));
    assert_eq!(rows_shown, json!(records));
    browser.screenshot("tree");

    // Changing one's mind: nothing is sent.
    browser.click("#terminate");
    browser.wait("the confirmation", "return document.getElementById('confirm').open;", json!([]));
    browser.click("#confirm-no");
    browser.wait(
        "the message that nothing was sent",
        "return document.getElementById('status').textContent === 'Nothing sent.';",
        json!([]),
    );
    assert_eq!(api(&server, &acme, "/v1/workflows/tree")["workflow"]["state"], "running");

    // Cancelled from the page, after saying yes: ended as the API says it did.
    browser.click("#cancel");
    browser.wait("the confirmation", "return document.getElementById('confirm').open;", json!([]));
    browser.click("#confirm-yes");
    let state = browser.wait(
        "the tree ended",
        "const s = document.getElementById('wf-state'); return s && s.textContent !== 'running' && s.textContent;",
        json!([]),
    );
    let described = api(&server, &acme, "/v1/workflows/tree")["workflow"].clone();
    assert_eq!(state, described["state"]);
    assert!(browser.text("#wf-result").starts_with(if described["state"] == "completed" { "ok" } else { "error" }));
    browser.screenshot("cancelled");

    // A signal to the waiter: it completes with the timeout's timer on its timeline.
    browser.go(&format!("{url}/ui#/workflow/waiter"));
    browser.wait(
        "the waiter's page",
        "return document.getElementById('workflow').dataset.id === 'waiter' && document.getElementById('wf-state');",
        json!([]),
    );
    let timers = browser.js("return document.querySelectorAll('#wf-chart rect.tl-timer').length;", json!([]));
    assert_eq!(timers, json!(1), "the pending timeout's timer");
    browser.type_into("#signal-topic", "go");
    browser.type_into("#signal-body", "\"from the console\"");
    browser.click("#signal");
    browser.wait("the confirmation", "return document.getElementById('confirm').open;", json!([]));
    browser.click("#confirm-yes");
    let state = browser.wait(
        "the waiter ended",
        "const s = document.getElementById('wf-state'); return s && s.textContent !== 'running' && s.textContent;",
        json!([]),
    );
    let described = api(&server, &acme, "/v1/workflows/waiter")["workflow"].clone();
    assert_eq!((state, &described["state"]), (json!("completed"), &json!("completed")));
    let result = browser.text("#wf-result");
    assert_eq!(result, format!("ok: {}", serde_json::to_string_pretty(&described["result"]["ok"]).unwrap()));
    browser.screenshot("signalled");

    // The talker's log lines.
    browser.go(&format!("{url}/ui#/workflow/talker"));
    let logs = browser.wait(
        "the talker's log",
        "const t = document.getElementById('wf-logs').textContent; return t.includes('hello, console') && t;",
        json!([]),
    );
    assert!(logs.as_str().unwrap().contains("a line without arguments"), "{logs}");

    // The host: one row a worker, as the API reads it.
    browser.go(&format!("{url}/ui#/host"));
    browser.wait(
        "two readings of the host",
        "return Number(document.getElementById('host').dataset.loaded) >= 2;",
        json!([]),
    );
    let workers = api(&server, &acme, "/v1/host")["workers"].as_array().unwrap().len();
    assert_eq!(browser.js("return document.querySelectorAll('#workers tbody tr').length;", json!([])), json!(workers));
    browser.screenshot("host");

    // Another tenant's token: none of it, not even by id.
    browser.click("#logout");
    browser.wait("the login form", "return !document.getElementById('login').hidden;", json!([]));
    browser.type_into("#token", &globex);
    browser.click("#login-form button[type=submit]");
    browser.go(&format!("{url}/ui#/workflows"));
    browser.wait("the workflows", "return document.getElementById('workflows').dataset.loaded;", json!([]));
    assert_eq!(rows(&browser), Vec::<String>::new());
    let all =
        browser.js("return Number(document.querySelector('#counts button[data-state=all]').dataset.count);", json!([]));
    assert_eq!(all, json!(0));
    browser.screenshot("another-tenant");
    browser.go(&format!("{url}/ui#/workflow/tree"));
    let refused = browser.wait(
        "the refusal",
        "const t = document.getElementById('status').textContent; return t.startsWith('No workflow') && t;",
        json!([]),
    );
    assert!(refused.as_str().unwrap().contains("tree"), "{refused}");
    assert_eq!(browser.js("return document.querySelectorAll('#wf-tree li[data-pid]').length;", json!([])), json!(0));
}

#[test]
fn the_console_is_served_with_its_files_and_a_policy_that_keeps_it_to_this_host() {
    let server = Server::start(&scratch("console-files"));
    for (path, kind) in [("/ui", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")] {
        let answer = server.exchange("GET", path, None, b"");
        let head = answer.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{path}: {head}");
        assert!(head.contains(&format!("content-type: {kind}")), "{path}: {head}");
        assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{path}: {head}");
        let tag = head.lines().find_map(|l| l.strip_prefix("etag: ")).expect("an etag").to_owned();
        let again = server.exchange_with("GET", path, None, &format!("If-None-Match: {tag}\r\n"), b"");
        assert!(again.starts_with("HTTP/1.1 304"), "{path} again: {again}");
    }
    // Nothing the page loads comes from elsewhere.
    let page = server.raw("GET", "/ui", None);
    assert!(!page.contains("http://") && !page.contains("https://"), "{page}");
    let (status, answer) = server.http("GET", "/ui/secrets.txt", None, b"");
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("not_found")), "{answer}");
}

#[test]
fn the_console_s_routes_count_by_state_list_with_progress_and_read_the_host() {
    let server = Server::start(&scratch("console-routes"));
    let (acme, globex) = (server.tenant("acme"), server.tenant("globex"));
    deploy_tour(&server, &acme);
    start(&server, &acme, "a-wait", "deadline", json!(60_000));
    start(&server, &acme, "b-done", "deadline", json!(1));
    start(&server, &acme, "b-fail", "fails", json!("on purpose"));
    for ended in ["b-done", "b-fail"] {
        server.http("GET", &format!("/v1/workflows/{ended}/result?wait=20s"), Some(&acme), b"");
    }
    assert_eq!(
        api(&server, &acme, "/v1/workflow-counts"),
        json!({"running": 1, "completed": 1, "failed": 1, "exact": true})
    );
    assert_eq!(
        api(&server, &acme, "/v1/workflow-counts?prefix=b-"),
        json!({"running": 0, "completed": 1, "failed": 1, "exact": true})
    );
    assert_eq!(
        api(&server, &acme, "/v1/workflow-counts?component=tour&prefix=a"),
        json!({"running": 1, "completed": 0, "failed": 0, "exact": true})
    );
    assert_eq!(
        api(&server, &globex, "/v1/workflow-counts"),
        json!({"running": 0, "completed": 0, "failed": 0, "exact": true})
    );
    assert_eq!(
        api(&server, &globex, "/v1/workflow-counts?component=tour"),
        json!({"running": 0, "completed": 0, "failed": 0, "exact": true})
    );
    let (status, answer) = server.http("GET", "/v1/workflow-counts?state=running", Some(&acme), b"");
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid")), "{answer}");
    assert_eq!(server.http("GET", "/v1/workflow-counts", None, b"").0, 401);

    // A listing with progress has what a description has; without it, neither.
    let page = api(&server, &acme, "/v1/workflows?progress=true&prefix=a");
    let described = api(&server, &acme, "/v1/workflows/a-wait")["workflow"].clone();
    assert_eq!(page["workflows"][0]["steps"], described["steps"]);
    assert_eq!(page["workflows"][0]["waiting"], described["waiting"]);
    assert_eq!(page["workflows"][0]["waiting"][0]["for"], "timer", "{page}");
    let plain = api(&server, &acme, "/v1/workflows?prefix=a");
    assert!(plain["workflows"][0].get("steps").is_none() && plain["workflows"][0].get("waiting").is_none(), "{plain}");
    // A page says how many records it read: a prefix reads only its own range.
    assert_eq!((&plain["examined"], &plain["partial"], &plain["next"]), (&json!(1), &json!(false), &Value::Null));
    let paged = api(&server, &acme, "/v1/workflows?limit=2");
    assert_eq!((&paged["examined"], &paged["partial"], &paged["next"]), (&json!(2), &json!(false), &json!("b-done")));
    for limit in ["0", "1001"] {
        let (status, answer) = server.http("GET", &format!("/v1/workflows?limit={limit}"), Some(&acme), b"");
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid")), "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("`limit` {limit}")) && message.contains("1 to 1000"), "{message}");
    }

    // The host's figures: counters that only grow, and the tenant's own running ones.
    let first = api(&server, &acme, "/v1/host");
    assert!(!first["workers"].as_array().unwrap().is_empty(), "{first}");
    assert!(first["steps"].as_u64() >= Some(3) && first["commits"].as_u64() >= Some(1), "{first}");
    assert_eq!((first["running"].as_u64(), api(&server, &globex, "/v1/host")["running"].as_u64()), (Some(1), Some(0)));
    let signalled = server.http("POST", "/v1/workflows/a-wait/signal", Some(&acme), br#"{"topic":"go"}"#);
    assert_eq!(signalled.0, 202);
    server.http("GET", "/v1/workflows/a-wait/result?wait=20s", Some(&acme), b"");
    let second = api(&server, &acme, "/v1/host");
    assert!(second["steps"].as_u64() > first["steps"].as_u64(), "{first} then {second}");
    assert!(second["at_ms"].as_u64() >= first["at_ms"].as_u64());
    assert_eq!(server.http("GET", "/v1/host", Some(&server.admin_token()), b"").0, 401);
}

/// The counts by state are kept as the workflows' records are written: after a `kill -9`
/// of the server, with workflows running, completed, failed, cancelled and terminated,
/// the next server counts what a listing of every workflow shows.
#[test]
fn the_counts_by_state_are_exact_after_a_kill_9_of_the_server() {
    let data = scratch("console-counts-kill");
    let server = Server::start(&data);
    let acme = server.tenant("acme");
    deploy_tour(&server, &acme);
    for i in 0..3 {
        start(&server, &acme, &format!("asleep-{i}"), "deadline", json!(600_000));
        start(&server, &acme, &format!("done-{i}"), "deadline", json!(1));
    }
    start(&server, &acme, "fails", "fails", json!("on purpose"));
    for (id, action) in [("asleep-1", "cancel"), ("asleep-2", "terminate")] {
        assert_eq!(server.http("POST", &format!("/v1/workflows/{id}/{action}"), Some(&acme), b"{}").0, 202, "{id}");
    }
    for id in ["done-0", "done-1", "done-2", "fails", "asleep-1", "asleep-2"] {
        let (status, answer) = server.http("GET", &format!("/v1/workflows/{id}/result?wait=20s"), Some(&acme), b"");
        assert_eq!(status, 200, "{id}: {answer}");
    }
    // What a listing of each shows, counted.
    let listed = |server: &Server| {
        let page = api(server, &acme, "/v1/workflows");
        let mut counts = json!({"running": 0, "completed": 0, "failed": 0, "exact": true});
        for workflow in page["workflows"].as_array().expect("workflows") {
            let state = workflow["state"].as_str().expect("a state");
            counts[state] = json!(counts[state].as_u64().unwrap_or_default() + 1);
        }
        counts
    };
    // `deadline` cancelled ends normally, saying so; terminated, it fails.
    let expected = json!({"running": 1, "completed": 4, "failed": 2, "exact": true});
    assert_eq!((listed(&server), api(&server, &acme, "/v1/workflow-counts")), (expected.clone(), expected.clone()));
    server.kill();

    let server = Server::start(&data);
    assert_eq!((listed(&server), api(&server, &acme, "/v1/workflow-counts")), (expected.clone(), expected));
}
