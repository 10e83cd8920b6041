//! The `http` provider: `http.request` GET round trips from native processes (each yields
//! a request, waits for its answer, and yields the next), against the same GETs made
//! straight with the provider's client crate (reqwest, HTTP/1.1, rustls with ring) on a
//! single-threaded tokio runtime, as the provider runs its own: the same loopback
//! server, the same concurrency (one task per process), the same run. The gap is what a
//! process pays for a request: its step, the dispatch, the JSON both ways, the lanes and
//! the wake-ups between the workers and the provider's thread.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::json;
use wasmproc::provider::http::{HostPattern, Http, HttpSettings};
use wasmproc::{Capabilities, Command, Event, Events, Payload, Port, Process, Scheduler, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report, measure_pair};

use crate::{WARMUP, short};

/// Processes (and baseline tasks) making requests at once: within the provider's
/// default bound of 8 in flight per process, since each makes one at a time.
const CONCURRENCY: u64 = 16;

/// An HTTP/1.1 server on `127.0.0.1` answering every request with `hello`, on one
/// thread of its own, so both sides share the machine's other core alike.
fn server() -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("bench-http-server")
        .build()
        .expect("the server's runtime starts");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port is free");
    listener.set_nonblocking(true).expect("the listener is non-blocking");
    let addr = listener.local_addr().expect("the listener has an address");
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio takes the listener");
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let hello = hyper::service::service_fn(|_| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"hello"))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), hello).await;
            });
        }
    });
    (addr, runtime)
}

/// Yields `http.request` `left` times, one after another.
struct Getter {
    request: Payload,
    left: u64,
}

impl Process for Getter {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            if let Event::Completion { result: Err(error), .. } = event {
                anyhow::bail!("`http.request` failed: {error}");
            }
        }
        if self.left == 0 {
            out.complete(Ok(Payload::empty()));
            return Ok(());
        }
        self.left -= 1;
        out.yield_command(self.left, Command::Custom { name: "http.request".into(), payload: self.request.clone() });
        Ok(())
    }
}

fn through_provider(s: &Scheduler, request: &Payload, each: u64) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let getter = Getter { request: request.clone(), left: each };
            s.handle().spawn(getter, "main").expect("a getter starts")
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join(), Ok(Payload::empty()));
    }
    start.elapsed()
}

/// A TLS setup on ring with no roots, for clients that speak plain HTTP only: reqwest is
/// built without a default TLS provider, and a client needs one all the same.
pub(crate) fn plain_tls() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

/// The client the provider builds, as far as plain HTTP cares.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(plain_tls())
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("the client builds")
}

fn direct(runtime: &tokio::runtime::Runtime, client: &reqwest::Client, url: &str, each: u64) -> Duration {
    let start = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..CONCURRENCY)
            .map(|_| {
                let (client, url) = (client.clone(), url.to_owned());
                tokio::spawn(async move {
                    for _ in 0..each {
                        let answer = client.get(&url).send().await.expect("the server answers");
                        assert_eq!(answer.bytes().await.expect("the body arrives").as_ref(), b"hello");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a task finishes");
        }
    });
    start.elapsed()
}

pub(crate) fn run(options: &Options, report: &mut Report) {
    let total = if options.quick { 800 } else { 8_000 };
    let each = total / CONCURRENCY;
    let name = format!("http/get-{}-c{CONCURRENCY}", short(total));
    if !options.selected(&name) {
        return;
    }
    let (addr, _server) = server();
    let pattern = HostPattern::parse(&addr.to_string()).expect("an address is a pattern");
    let http =
        Http::start(HttpSettings { allow: vec![pattern], ..HttpSettings::default() }).expect("the provider starts");
    let s = Scheduler::builder()
        .workers(options.workers)
        .provider(http)
        .capabilities(Capabilities::default().allow("http.*"))
        .build()
        .expect("the scheduler starts");
    let url = format!("http://{addr}/hello");
    let request = Payload::json(&json!({ "url": url })).expect("the input serialises");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("the runtime starts");
    let client = client();

    let (ours, theirs) = measure_pair(options.runs, WARMUP, &mut || through_provider(&s, &request, each), &mut || {
        direct(&runtime, &client, &url, each)
    });
    // Expected: the provider's thread does the baseline's work, plus a step, JSON and two
    // cross-thread wake-ups a request, on a machine whose two cores it shares with the
    // server; 1.5× allows for those.
    report.push(Record::rate(&name, "requests/s", total, &ours, Some(&theirs)).goal(Condition::ratio_at_most(1.5)));
    s.stop(Duration::from_secs(1));
}
