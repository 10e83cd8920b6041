//! The console (`wasmproc serve`'s `/ui`) with 100,000 workflows in the server, in
//! headless chromium (Debian's, through chromedriver: see `wasmproc_tests::browser`):
//!
//! - `console/first-render-100k`: from the start of the page's navigation to the
//!   workflows' table drawn (its first page, with the counts by state), as the page
//!   marks it (`performance.mark("wasmproc:first-render")`), for a user signed in (the
//!   token in the tab's storage; the page's files revalidated, as on a return visit);
//! - `console/weight-100k`: the bytes a first visit downloads to draw that table: the
//!   page, its script and style, a page of 50 workflows with their progress, the counts;
//!   the browser must have loaded nothing else;
//! - `console/api-list-100k`, `console/api-counts-100k`: the two API requests the table
//!   makes, timed from the bench, to tell the server's share;
//! - `console/api-list-deep-100k`: a page from the middle of the ids (`after=`), as
//!   *Next* asks for it: the same cost as the first, since a page reads from its cursor;
//! - `console/api-list-filtered-100k`: a page of a filter no workflow matches
//!   (`state=failed`), which reads the most records one request may (10,000) and answers
//!   an empty, partial page: the bound of any listing's cost.
//!
//! The workflows are the service bench's (the SDK tour's `race` with `[0]`: one durable
//! step), all ended, started through the API by 8 clients. Budgets (BENCHMARKS.md): the
//! first render within 1 s and the weight within 128 KiB. Without chromium or
//! chromedriver the browser rows are skipped with the reason printed. Quick mode: 10,000
//! workflows.

use std::time::{Duration, Instant};

use serde_json::json;
use wasmproc_tests::bench::{Condition, Options, Record, Report, Sample};
use wasmproc_tests::browser::Browser;

use crate::service::{Server, client, served_bench};
use crate::{WARMUP, short};

/// Workflows on the table's first page, as the page asks for them by default.
const PAGE: usize = 50;

/// Clients filling the server: fewer than the service bench's, since the filling is not
/// what is measured and on a loaded machine more at once push a workflow's first step
/// past the server's 100 ms bound on it.
const FILLERS: u64 = 8;

/// Measures the selected workloads into `report`.
pub fn run(options: &Options, report: &mut Report) {
    let count: u64 = if options.quick { 10_000 } else { 100_000 };
    let n = short(count);
    let names = [
        format!("console/first-render-{n}"),
        format!("console/weight-{n}"),
        format!("console/api-list-{n}"),
        format!("console/api-counts-{n}"),
        format!("console/api-list-deep-{n}"),
        format!("console/api-list-filtered-{n}"),
    ];
    if !names.iter().any(|name| options.selected(name)) {
        return;
    }
    let [render, weight, list, counts, deep, filtered] = names;
    let (scratch, wasmproc, runtime) = served_bench("console");
    let http = client();
    let server = Server::start(&wasmproc, &scratch.join("data"), options.workers);
    let token = server.tenant(&runtime, &http);
    let filled = server.workflows(&runtime, &http, &token, "wf", count, FILLERS);
    println!("  ({count} workflows started and ended through the API in {:.1} s)", filled.as_secs_f64());
    let url = server.url.clone();

    // The API's two requests of the table.
    let get = |path: &str| -> (Duration, Vec<u8>) {
        runtime.block_on(async {
            let begun = Instant::now();
            let answer = http.get(format!("{url}{path}")).bearer_auth(&token).send().await.expect("an answer");
            assert_eq!(answer.status().as_u16(), 200, "{path}");
            let body = answer.bytes().await.expect("a body").to_vec();
            (begun.elapsed(), body)
        })
    };
    let list_path = format!("/v1/workflows?limit={PAGE}&progress=true");
    let timed = |path: &str| {
        let runs: Vec<Duration> = (0..WARMUP + options.runs).map(|_| get(path).0).skip(WARMUP).collect();
        Sample::of(runs)
    };
    report.push(Record::time(&list, &timed(&list_path), None));
    report.push(Record::time(&counts, &timed("/v1/workflow-counts"), None));
    let answer = |path: &str| -> serde_json::Value { serde_json::from_slice(&get(path).1).expect("JSON") };
    let counted = answer("/v1/workflow-counts");
    assert_eq!((&counted["completed"], &counted["exact"]), (&json!(count), &json!(true)), "{counted}");
    // The ids sort as text: `wf-5` is about the middle of `wf-0` … `wf-99999`.
    let deep_path = format!("/v1/workflows?limit={PAGE}&progress=true&after=wf-5");
    assert_eq!(answer(&deep_path)["workflows"].as_array().map(Vec::len), Some(PAGE), "a full page from the middle");
    report.push(Record::time(&deep, &timed(&deep_path), None));
    let filtered_path = format!("/v1/workflows?limit={PAGE}&state=failed");
    let page = answer(&filtered_path);
    let bounded = json!(count.min(10_000));
    assert_eq!(
        (&page["workflows"], &page["partial"], &page["examined"]),
        (&json!([]), &json!(count > 10_000), &bounded)
    );
    report.push(Record::time(&filtered, &timed(&filtered_path), None));

    // What a first visit downloads: the page's files without a token, the table's data
    // with one.
    let mut bytes = 0;
    let mut fetched = Vec::new();
    for path in ["/ui", "/ui/app.js", "/ui/app.css", list_path.as_str(), "/v1/workflow-counts"] {
        bytes += get(path).1.len();
        fetched.push(path.split('?').next().unwrap_or(path).to_owned());
    }

    let shots = crate::target_dir().join("bench").join("console-screenshots");
    let browser = match std::panic::catch_unwind(|| Browser::start(&shots, &scratch.join("profile"))) {
        Ok(browser) => browser,
        Err(_) => {
            println!("  the console's page is not measured: no chromium or chromedriver (`.ci/run` installs them)");
            return;
        }
    };
    browser.go(&format!("{url}/ui"));
    browser.js("sessionStorage.setItem('wasmproc.token', arguments[0]);", json!([token]));
    let mut times = Vec::new();
    for run in 0..WARMUP + options.runs {
        browser.go("about:blank");
        browser.go(&format!("{url}/ui#/workflows"));
        let at = browser.wait(
            "the first render",
            "const m = performance.getEntriesByName('wasmproc:first-render'); return m.length > 0 && m[0].startTime;",
            json!([]),
        );
        if run == WARMUP {
            let loaded = browser
                .js("return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname);", json!([]));
            let loaded: Vec<String> = serde_json::from_value(loaded).expect("paths");
            let unknown: Vec<&String> = loaded.iter().filter(|p| !fetched.contains(p)).collect();
            assert!(unknown.is_empty(), "the page loaded more than the weight counts: {unknown:?}");
            let rows = browser.js("return document.querySelectorAll('#wf-rows tr[data-id]').length;", json!([]));
            assert_eq!(rows, json!(PAGE), "the first page's rows");
            browser.screenshot(&format!("workflows-{n}"));
        }
        if run >= WARMUP {
            times.push(Duration::from_secs_f64(at.as_f64().expect("a time") / 1e3));
        }
    }
    report.push(Record::time(&render, &Sample::of(times), None).goal(Condition::median_at_most(1000.0)));
    report.push(Record::single(&weight, "KiB", bytes as f64 / 1024.0).goal(Condition::median_at_most(128.0)));
    drop(browser);
    server.stop();
}
