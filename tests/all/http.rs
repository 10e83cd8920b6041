//! The `http` provider against a real HTTP server on loopback: the allow-list, the
//! private-address rule, redirects, time and size limits, the bounds on a flood, bodies.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use http_body_util::Full;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use wasmproc::provider::http::{HostPattern, Http, HttpSettings};
use wasmproc::{Capabilities, Command, Outcome, Payload, Scheduler};
use wasmproc_tests::{HANG, Probe, Scripted, completion};

/// An HTTP/1.1 server on `127.0.0.1`, port 0, on a runtime of its own; it stops when
/// dropped. Routes:
///
/// - `/hello`: `hello`;
/// - `/echo`: the request's body, with `x-echo-method` and `x-echo-header` (the request's
///   `x-test`);
/// - `/binary`: bytes that are not UTF-8;
/// - `/big`, `/big-chunked`: 64 KiB, with a length or chunked;
/// - `/slow`: answers after 10 s;
/// - `/hold`: answers once the gate opens, counting the requests it holds;
/// - `/redirect/<code>?to=<location>`: a redirect.
struct Server {
    addr: SocketAddr,
    state: Arc<ServerState>,
    gate: tokio::sync::watch::Sender<bool>,
    _runtime: tokio::runtime::Runtime,
}

#[derive(Default)]
struct ServerState {
    /// Requests of any route received.
    hits: AtomicUsize,
    /// `/hold` requests being held now, and the most at once.
    holding: AtomicUsize,
    most_held: AtomicUsize,
}

const BIG: usize = 64 << 10;

type Answer = Response<BoxBody<Bytes, Infallible>>;

impl Server {
    fn start() -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .thread_name("http-test-server")
            .build()
            .expect("the server's runtime starts");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port is free");
        listener.set_nonblocking(true).expect("the listener is non-blocking");
        let addr = listener.local_addr().expect("the listener has an address");
        let state = Arc::new(ServerState::default());
        let (gate, opened) = tokio::sync::watch::channel(false);
        let shared = state.clone();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio takes the listener");
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (state, opened) = (shared.clone(), opened.clone());
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request| route(state.clone(), opened.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server { addr, state, gate, _runtime: runtime }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    fn most_held(&self) -> usize {
        self.state.most_held.load(Ordering::SeqCst)
    }

    fn holding(&self) -> usize {
        self.state.holding.load(Ordering::SeqCst)
    }
}

/// One request counted in `holding` until it is answered or its connection closes
/// (hyper then drops the handler).
struct Held<'a>(&'a ServerState);

impl<'a> Held<'a> {
    fn new(state: &'a ServerState) -> Self {
        let now = state.holding.fetch_add(1, Ordering::SeqCst) + 1;
        state.most_held.fetch_max(now, Ordering::SeqCst);
        Held(state)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.holding.fetch_sub(1, Ordering::SeqCst);
    }
}

fn full(status: u16, body: impl Into<Bytes>) -> Answer {
    let mut answer = Response::new(Full::new(body.into()).boxed());
    *answer.status_mut() = hyper::StatusCode::from_u16(status).expect("a valid status");
    answer
}

/// A body of `left` bytes in 1 KiB frames, without a length: sent chunked.
struct Chunks {
    left: usize,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(1024);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; n])))))
    }
}

async fn route(
    state: Arc<ServerState>,
    mut opened: tokio::sync::watch::Receiver<bool>,
    request: Request<Incoming>,
) -> Result<Answer, Infallible> {
    state.hits.fetch_add(1, Ordering::SeqCst);
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let answer = match path.as_str() {
        "/hello" => full(200, "hello"),
        "/echo" => {
            let method = request.method().to_string();
            let header = request.headers().get("x-test").map(|v| v.as_bytes().to_vec()).unwrap_or_default();
            let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let mut answer = full(200, body);
            answer.headers_mut().insert("x-echo-method", method.parse().expect("a method is a header value"));
            answer.headers_mut().insert("x-echo-header", header.try_into().expect("it was a header value"));
            answer
        }
        "/binary" => full(200, vec![0x00, 0x9f, 0x92, 0x96, 0xff]),
        "/big" => full(200, vec![b'x'; BIG]),
        "/big-chunked" => Response::new(Chunks { left: BIG }.boxed()),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            full(200, "late")
        }
        "/hold" => {
            let _held = Held::new(&state);
            let _ = opened.wait_for(|open| *open).await;
            full(200, "held")
        }
        _ => match path.strip_prefix("/redirect/").and_then(|code| code.parse::<u16>().ok()) {
            Some(code) => {
                let to = query.strip_prefix("to=").unwrap_or("/hello");
                let mut answer = full(code, "");
                answer.headers_mut().insert("location", to.parse().expect("a location is a header value"));
                answer
            }
            None => full(404, "no such route"),
        },
    };
    Ok(answer)
}

fn pattern(text: &str) -> HostPattern {
    HostPattern::parse(text).unwrap_or_else(|e| panic!("`{text}` should parse: {e}"))
}

fn settings(allow: &[&str]) -> HttpSettings {
    HttpSettings { allow: allow.iter().map(|p| pattern(p)).collect(), ..HttpSettings::default() }
}

fn scheduler(settings: HttpSettings) -> Scheduler {
    let http = Http::start(settings).expect("the provider starts");
    Scheduler::builder()
        .workers(2)
        .provider(http)
        .capabilities(Capabilities::default().allow("http.*"))
        .build()
        .expect("the scheduler starts")
}

fn command(name: &'static str, input: Value) -> Command {
    Command::Custom { name: name.into(), payload: Payload::json(&input).expect("the input serialises") }
}

/// Spawns a process that yields `commands` at once (tags 1, 2, …) and completes once
/// every one has completed; the probe records the completions.
fn spawn_yielding(s: &Scheduler, commands: Vec<Command>) -> (wasmproc::scheduler::ProcessHandle, Arc<Probe>) {
    let count = commands.len();
    let mut seen = 0;
    let (process, probe) = Scripted::new(move |t| {
        if t.step == 0 {
            for (tag, command) in commands.iter().enumerate() {
                t.out.yield_command(tag as u64 + 1, command.clone());
            }
        }
        seen += t.events.len();
        if seen == count {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    let handle = s.handle().spawn(process, "main").expect("the process starts");
    (handle, probe)
}

/// The outcomes of `commands`, in order.
fn outcomes(s: &Scheduler, commands: Vec<Command>) -> Vec<Outcome> {
    let count = commands.len();
    let (handle, probe) = spawn_yielding(s, commands);
    handle.join_timeout(HANG).expect("the process ends in time").expect("the process succeeds");
    let events = probe.events();
    (1..=count as u64)
        .map(|tag| events.iter().find_map(|e| completion(e, tag)).expect("every command completed").clone())
        .collect()
}

/// The answer to one `http.request` as JSON, or its error.
fn request(s: &Scheduler, input: Value) -> Result<Value, String> {
    let outcome = outcomes(s, vec![command("http.request", input)]).remove(0);
    outcome.map(|payload| payload.parse_json().expect("the answer is JSON"))
}

fn get(s: &Scheduler, url: &str) -> Result<Value, String> {
    request(s, json!({ "url": url }))
}

#[test]
fn an_allowed_host_answers_with_status_headers_and_body() {
    let server = Server::start();
    let s = scheduler(settings(&[&format!("127.0.0.1:{}", server.port())]));
    let answer = get(&s, &server.url("/hello")).unwrap();
    assert_eq!(answer["status"], 200);
    assert_eq!(answer["body"], "hello");
    assert!(answer["headers"].as_array().unwrap().contains(&json!(["content-length", "5"])), "{answer}");
    assert_eq!(get(&s, &server.url("/nowhere")).unwrap()["status"], 404, "a status is an answer, not a failure");
}

#[test]
fn hosts_outside_the_allow_list_are_denied_with_the_pattern_to_add() {
    let server = Server::start();
    let s = scheduler(settings(&["127.0.0.1:1"]));
    assert_eq!(
        get(&s, "http://other.test:8080/x").unwrap_err(),
        "denied: http://other.test:8080/ is not allowed: no --allow-host pattern matches other.test:8080 \
         (grant it with --allow-host other.test:8080)"
    );
    let port = server.port();
    assert_eq!(
        get(&s, &server.url("/hello")).unwrap_err(),
        format!(
            "denied: http://127.0.0.1:{port}/ is not allowed: no --allow-host pattern matches 127.0.0.1:{port} \
             (grant it with --allow-host 127.0.0.1:{port})"
        )
    );
    let nothing = scheduler(HttpSettings::default());
    assert!(get(&nothing, &server.url("/hello")).unwrap_err().starts_with("denied: "), "nothing by default");
    assert_eq!(server.hits(), 0, "a denied request never reaches the server");
}

#[test]
fn wildcards_never_admit_addresses_and_names_never_reach_loopback() {
    let server = Server::start();
    let port = server.port();
    let s = scheduler(settings(&["*:*"]));
    let by_address = get(&s, &server.url("/hello")).unwrap_err();
    assert!(by_address.contains("no --allow-host pattern matches 127.0.0.1"), "{by_address}");
    // `*:*` admits the name; its resolver refuses the loopback address it resolves to.
    let by_name = get(&s, &format!("http://localhost:{port}/hello")).unwrap_err();
    assert_eq!(
        by_name,
        format!(
            "denied: http://localhost:{port}/ is not allowed: localhost resolves to 127.0.0.1, a loopback address, \
             and a pattern of a DNS name admits public addresses only, or loopback for `localhost` \
             (grant it with --allow-host localhost:{port})"
        )
    );
    assert_eq!(server.hits(), 0);
}

#[test]
fn the_localhost_pattern_reaches_loopback_on_its_port_only() {
    let server = Server::start();
    let port = server.port();
    let s = scheduler(settings(&[&format!("localhost:{port}")]));
    assert_eq!(get(&s, &format!("http://localhost:{port}/hello")).unwrap()["body"], "hello");
    // Another port of localhost, admitted by `*:*` alone, may not reach loopback.
    let other = Server::start();
    let s = scheduler(settings(&[&format!("localhost:{port}"), "*:*"]));
    let error = get(&s, &format!("http://localhost:{}/hello", other.port())).unwrap_err();
    assert!(error.starts_with("denied: ") && error.contains("a loopback address"), "{error}");
    assert_eq!(other.hits(), 0);
}

#[test]
fn redirects_are_followed_and_checked_hop_by_hop() {
    let server = Server::start();
    let port = server.port();
    let s = scheduler(settings(&[&format!("127.0.0.1:{port}"), "*:*"]));
    let followed = get(&s, &server.url("/redirect/302?to=/hello")).unwrap();
    assert_eq!((&followed["status"], &followed["body"]), (&json!(200), &json!("hello")));

    let denied = get(&s, &server.url("/redirect/302?to=http://10.0.0.1:8080/")).unwrap_err();
    assert!(denied.starts_with("denied: http://10.0.0.1:8080/ is not allowed: no --allow-host pattern matches"));
    let only_here = scheduler(settings(&[&format!("127.0.0.1:{port}")]));
    let denied = get(&only_here, &server.url("/redirect/301?to=http://other.test:8080/")).unwrap_err();
    assert!(denied.contains("(grant it with --allow-host other.test:8080)"), "{denied}");
    // The next hop is a name `*:*` admits, but it resolves to loopback: the first hop's
    // address pattern does not carry over.
    let rebound = get(&s, &server.url(&format!("/redirect/307?to=http://localhost:{port}/hello"))).unwrap_err();
    assert!(rebound.contains("localhost resolves to 127.0.0.1, a loopback address"), "{rebound}");

    let post = |path: &str| request(&s, json!({ "method": "POST", "url": server.url(path), "body": "data" })).unwrap();
    let see_other = post("/redirect/303?to=/echo");
    assert_eq!((&see_other["body"], header(&see_other, "x-echo-method")), (&json!(""), Some("GET")));
    let temporary = post("/redirect/307?to=/echo");
    assert_eq!((&temporary["body"], header(&temporary, "x-echo-method")), (&json!("data"), Some("POST")));

    let limited = Http::start(HttpSettings { max_redirects: 1, ..settings(&[&format!("127.0.0.1:{port}")]) });
    let limited = Scheduler::builder()
        .workers(1)
        .provider(limited.unwrap())
        .capabilities(Capabilities::default().allow("http.*"))
        .build()
        .unwrap();
    assert_eq!(get(&limited, &server.url("/redirect/302?to=/hello")).unwrap()["body"], "hello");
    let twice = get(&limited, &server.url("/redirect/302?to=/redirect/302?to=/hello")).unwrap_err();
    assert!(twice.starts_with("limit: more than 1 redirects"), "{twice}");
}

fn header<'a>(answer: &'a Value, name: &str) -> Option<&'a str> {
    answer["headers"].as_array()?.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str())
}

#[test]
fn a_slow_answer_times_out() {
    let server = Server::start();
    let timeout = Duration::from_millis(300);
    let s = scheduler(HttpSettings { timeout, ..settings(&[&format!("127.0.0.1:{}", server.port())]) });
    let start = Instant::now();
    let error = get(&s, &server.url("/slow")).unwrap_err();
    assert!(error.starts_with("timeout: no complete answer from http://127.0.0.1:"), "{error}");
    assert!(start.elapsed() >= timeout && start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
}

#[test]
fn an_oversized_answer_fails_at_the_limit() {
    let server = Server::start();
    let max_response_body = 1024;
    let s = scheduler(HttpSettings { max_response_body, ..settings(&[&format!("127.0.0.1:{}", server.port())]) });
    let declared = get(&s, &server.url("/big")).unwrap_err();
    assert!(declared.starts_with("limit: the answer from http://127.0.0.1:"), "{declared}");
    assert!(declared.ends_with(&format!("is {BIG} bytes, over the limit of 1024")), "{declared}");
    let streamed = get(&s, &server.url("/big-chunked")).unwrap_err();
    assert!(streamed.starts_with("limit: ") && streamed.contains("passed the limit of 1024 bytes"), "{streamed}");
    assert_eq!(get(&s, &server.url("/hello")).unwrap()["body"], "hello");
}

#[test]
fn a_flood_runs_its_bound_queues_its_bound_and_is_refused_past_both() {
    let server = Server::start();
    let s = scheduler(settings(&[&format!("127.0.0.1:{}", server.port())]));
    let defaults = HttpSettings::default();
    let (running, queued) = (defaults.max_in_flight_per_process, defaults.max_queued_per_process);
    let flood = 200;
    let commands = (0..flood).map(|_| command("http.request", json!({ "url": server.url("/hold") }))).collect();
    let (handle, probe) = spawn_yielding(&s, commands);

    // The refusals complete at once, while the first requests are held.
    wait_until(|| probe.completion_tags().len() >= flood - running - queued && server.holding() >= running);
    let refused = probe.completion_tags();
    assert_eq!(refused.len(), flood - running - queued, "nothing but the refusals answered yet");
    let events = probe.events();
    for tag in refused {
        assert!(tag as usize > running + queued, "the last ones are refused, not {tag}");
        let error = events.iter().find_map(|e| completion(e, tag)).unwrap().as_ref().unwrap_err();
        assert!(
            error.starts_with("limit: process ") && error.contains("8 http requests in flight and 64 queued"),
            "{error}"
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!((server.holding(), server.most_held()), (running, running), "the per-process bound at the server");

    server.open_gate();
    handle.join_timeout(HANG).expect("the flood ends in time").expect("the process succeeds");
    let answered =
        probe.events().iter().filter(|e| matches!(e, wasmproc::Event::Completion { result: Ok(_), .. })).count();
    assert_eq!(answered, running + queued);
    assert_eq!(server.most_held(), running, "never more in flight at once");
    assert_eq!(server.hits(), running + queued);
}

/// Queued bodies count against a per-process bound in bytes: past it a request fails
/// `limit` at once, saying how much is queued.
#[test]
fn queued_bodies_are_bounded_in_bytes() {
    let server = Server::start();
    let allow = settings(&[&format!("127.0.0.1:{}", server.port())]);
    let s = scheduler(HttpSettings { max_in_flight_per_process: 1, max_queued_bytes_per_process: 1000, ..allow });
    let post =
        || command("http.request", json!({ "method": "POST", "url": server.url("/hold"), "body": "x".repeat(600) }));
    let (handle, probe) = spawn_yielding(&s, vec![post(), post(), post()]);
    wait_until(|| probe.completion_tags().len() == 1 && server.holding() == 1);
    assert_eq!(probe.completion_tags(), vec![3], "the first runs, the second waits, the third is refused");
    let events = probe.events();
    let error = events.iter().find_map(|e| completion(e, 3)).unwrap().as_ref().unwrap_err();
    assert!(
        error.starts_with("limit: process ") && error.contains("1 queued (600 bytes of bodies, and this one's 600)"),
        "{error}"
    );
    server.open_gate();
    handle.join_timeout(HANG).expect("the process ends in time").expect("the process succeeds");
    assert_eq!(server.hits(), 2);
}

/// A process's requests go when it ends: those queued never reach the server and free
/// their bodies at once, the one in flight is dropped (its connection closed) without
/// waiting for an answer, and another process's request waiting behind them for a place
/// runs at once.
#[test]
fn an_ended_process_s_requests_go_with_it() {
    let server = Server::start();
    let s = scheduler(HttpSettings { max_in_flight: 1, ..settings(&[&format!("127.0.0.1:{}", server.port())]) });
    let hold = (0..3).map(|_| command("http.request", json!({ "url": server.url("/hold") }))).collect();
    let (ended, _) = spawn_yielding(&s, hold);
    wait_until(|| server.holding() == 1);
    s.handle().terminate(ended.pid()).expect("the process is running");
    assert!(ended.join_timeout(HANG).expect("it ends").is_err());
    // With the gate still closed: the held request was the only place.
    assert_eq!(get(&s, &server.url("/hello")).unwrap()["body"], "hello");
    wait_until(|| server.holding() == 0);
    assert_eq!(server.holding(), 0, "the request in flight was dropped");
    assert_eq!(server.hits(), 2, "the queued requests never started");
}

#[test]
fn the_global_bound_holds_across_processes() {
    let server = Server::start();
    let max_in_flight = 3;
    let s = scheduler(HttpSettings { max_in_flight, ..settings(&[&format!("127.0.0.1:{}", server.port())]) });
    let hold = || (0..4).map(|_| command("http.request", json!({ "url": server.url("/hold") }))).collect();
    let (a, _) = spawn_yielding(&s, hold());
    let (b, _) = spawn_yielding(&s, hold());
    wait_until(|| server.holding() >= max_in_flight);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(server.most_held(), max_in_flight);
    server.open_gate();
    for process in [a, b] {
        process.join_timeout(HANG).expect("the process ends in time").expect("the process succeeds");
    }
    assert_eq!((server.hits(), server.most_held()), (8, max_in_flight));
}

#[test]
fn bodies_and_headers_travel_both_ways() {
    let server = Server::start();
    let s = scheduler(settings(&[&format!("127.0.0.1:{}", server.port())]));
    let echoed = request(
        &s,
        json!({ "method": "PUT", "url": server.url("/echo"), "headers": [["x-test", "yes"]], "body": "ping" }),
    )
    .unwrap();
    assert_eq!(echoed["body"], "ping");
    assert_eq!((header(&echoed, "x-echo-method"), header(&echoed, "x-echo-header")), (Some("PUT"), Some("yes")));

    let binary = get(&s, &server.url("/binary")).unwrap();
    assert_eq!((binary.get("body"), &binary["body_base64"]), (None, &json!("AJ+Slv8=")));
    let round_trip =
        request(&s, json!({ "method": "POST", "url": server.url("/echo"), "body_base64": "AJ+Slv8=" })).unwrap();
    assert_eq!(round_trip["body_base64"], "AJ+Slv8=");
}

#[test]
fn bad_input_is_invalid_and_a_big_request_body_is_over_the_limit() {
    let server = Server::start();
    let s = scheduler(HttpSettings { max_request_body: 4, ..settings(&[&format!("127.0.0.1:{}", server.port())]) });
    let outcomes = outcomes(
        &s,
        vec![
            command("http.fetch", json!({})),
            command("http.request", json!({ "url": "ftp://127.0.0.1/" })),
            command("http.request", json!({ "method": "TRACE", "url": server.url("/echo") })),
            command("http.request", json!({ "url": server.url("/echo"), "headers": [["content-length", "1"]] })),
            command("http.request", json!({ "uri": server.url("/echo") })),
            command("http.request", json!({ "method": "POST", "url": server.url("/echo"), "body": "12345" })),
        ],
    );
    let errors: Vec<String> = outcomes.into_iter().map(|o| o.unwrap_err()).collect();
    assert_eq!(errors[0], "invalid: unknown command `http.fetch`; the http commands are http.request");
    assert!(errors[1].starts_with("invalid: unsupported scheme `ftp`"), "{}", errors[1]);
    assert!(errors[2].starts_with("invalid: unsupported method `TRACE`"), "{}", errors[2]);
    assert_eq!(errors[3], "invalid: the header `content-length` is the client's to set");
    assert!(errors[4].starts_with("invalid: `http.request` takes JSON input: unknown field `uri`"), "{}", errors[4]);
    assert_eq!(errors[5], "limit: the request body is 5 bytes, over the limit of 4");
    assert_eq!(server.hits(), 0);
}

#[test]
fn unreachable_servers_are_unavailable() {
    // Bound, then closed: nothing listens on the port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = Server::start();
    let s = scheduler(settings(&[&format!("127.0.0.1:{port}"), &format!("127.0.0.1:{}", server.port())]));
    let error = get(&s, &format!("http://127.0.0.1:{port}/")).unwrap_err();
    assert!(error.starts_with(&format!("unavailable: request to http://127.0.0.1:{port}/ failed: ")), "{error}");
    // HTTPS to a server that speaks plain HTTP: the TLS handshake is tried, and fails.
    let https = format!("https://127.0.0.1:{}/hello", server.port());
    let error = get(&s, &https).unwrap_err();
    assert!(error.starts_with("unavailable: request to https://127.0.0.1:"), "{error}");
}

/// Waits until `done` holds, or [`HANG`] passes.
fn wait_until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + HANG;
    while !done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn ungranted_processes_cannot_use_it() {
    let server = Server::start();
    let http = Http::start(settings(&[&format!("127.0.0.1:{}", server.port())])).unwrap();
    let s = Scheduler::builder().workers(1).provider(http).build().unwrap();
    assert_eq!(get(&s, &server.url("/hello")).unwrap_err(), "permission denied: http.request");
}

#[test]
fn a_stopping_scheduler_drops_its_requests_in_flight() {
    let server = Server::start();
    let s = scheduler(settings(&[&format!("127.0.0.1:{}", server.port())]));
    let (_held, _) = spawn_yielding(&s, vec![command("http.request", json!({ "url": server.url("/hold") }))]);
    wait_until(|| server.holding() == 1);
    let start = Instant::now();
    s.stop(Duration::ZERO);
    drop(s);
    // The request ends (its connection closes) long before its 30 s timeout.
    wait_until(|| server.holding() == 0);
    assert_eq!(server.holding(), 0);
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
}
