//! `http.*`: outbound HTTP requests for processes, to an allow-list of hosts.
//!
//! ```
//! use wasmproc::provider::http::{HostPattern, Http, HttpSettings};
//! use wasmproc::{Capabilities, Scheduler};
//!
//! let mut settings = HttpSettings::default();
//! settings.allow.push(HostPattern::parse("https://api.example.com")?);
//! let http = Http::start(settings)?;
//! let scheduler = Scheduler::builder()
//!     .provider(http.clone())
//!     .capabilities(Capabilities::default().allow("http.*"))
//!     .build()?;
//! // Processes granted `http.*` may now yield `http.request` for https://api.example.com.
//! scheduler.stop(std::time::Duration::from_secs(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is allowed
//!
//! Nothing, by default: with no [`HostPattern`] in [`HttpSettings::allow`] every URL
//! is denied, and a process also needs the commands granted
//! (`Capabilities::allow("http.*")`). A process is untrusted code; the host it runs on
//! usually sits inside a network that trusts it, so reaching anything is a grant.
//!
//! # Patterns
//!
//! `[scheme://]host[:port]` (see [`HostPattern`]): the scheme `http` or `https`
//! (omitted, both); the host a DNS name, `*.example.com` (any subdomain, not
//! `example.com` itself), `*` (any DNS name) or an IP literal (`10.0.0.5`, `[::1]`);
//! the port a number or `*` (omitted, the scheme's default: 80 or 443, so `example.com`
//! does not admit `http://example.com:8080/`). A URL is allowed when any pattern admits
//! its scheme, host and port. A denial says which pattern would admit the URL.
//!
//! # Private addresses
//!
//! A DNS name admitted by a pattern may connect only to public addresses: never to a
//! loopback, private-network (`10/8`, `172.16/12`, `192.168/16`, `100.64/10`,
//! `fc00::/7`), link-local (`169.254/16`: cloud metadata services), unspecified,
//! multicast or reserved one. A name is a promise about nothing: `*.example.com` admits
//! `internal.example.com`, whose owner can point it at `127.0.0.1` at any time, and
//! `*` admits every name that does. Two exceptions, both naming the target outright:
//!
//! - an IP-literal pattern admits that address, whatever it is: `10.0.0.5:8080`
//!   admits `http://10.0.0.5:8080/`. Wildcards never admit IP literals, and literal
//!   URLs are never resolved, so this is the only way to reach an address by number;
//! - the pattern `localhost` (with its port) lets the name `localhost` reach loopback
//!   addresses, and only those.
//!
//! The check is made on the addresses the client connects to, by its resolver, so a
//! name's answer cannot change between the check and the connection (DNS rebinding):
//! see `address.rs`.
//!
//! # Limits
//!
//! From [`HttpSettings`], each one why:
//!
//! - `timeout` (30 s) bounds a request from its start to its last body byte,
//!   redirects included: a slow server cannot hold a process's places for ever. Time
//!   spent queued (below) does not count.
//! - `max_request_body` (1 MiB) and `max_response_body` (8 MiB): the answer is a
//!   payload held in memory, so its size is checked as it arrives, and reading stops
//!   at the limit rather than buffering the rest.
//! - `max_in_flight_per_process` (8) requests of one process run at once, and
//!   `max_queued_per_process` (64) more, with bodies of `max_queued_bytes_per_process`
//!   (8 MiB) in all, wait in its FIFO; past those a request fails `limit` at once, so a
//!   process flooding requests learns it at once and holds nothing. `max_in_flight`
//!   (256) bounds all processes together, which take turns for places as they free up
//!   (see `lanes.rs`). When a process ends, its queued requests are dropped at once,
//!   and those in flight within `STOP_POLL` (100 ms): nobody is left to read their
//!   answers, and their bodies would be charged to no one.
//!
//! # Idempotency keys
//!
//! A request of a durable process carries its command's idempotency key
//! ([`Request::idempotency_key`]) in the header `Idempotency-Key`, unless the process set
//! that header itself. A crash makes the host carry out again the commands that were in
//! flight, on this node or, in a cluster, on the node that takes the shard over, always
//! with the same key: a server that honours the header (as payment and many other APIs
//! do) carries each one out once. Requests of processes that are not durable carry none.
//!
//! # Redirects
//!
//! Followed up to `max_redirects` (5), each hop checked exactly like the first URL:
//! scheme, allow-list and addresses, so an allowed server cannot redirect a process
//! somewhere it could not go itself. 303, and 301 or 302 after a POST, turn the request
//! into a GET without the body; credentials (`authorization`, `cookie`) are not sent to
//! another origin.
//!
//! # Threads
//!
//! [`Http::start`] starts one thread with a single-threaded tokio runtime; every
//! request of every scheduler the provider is registered with runs on it as a task, so
//! thousands of waiting requests cost no thread each. Name lookups use the system's
//! resolver on the runtime's blocking threads.
//!
//! Dropping the last clone of the [`Http`] fails the queued requests `unavailable`,
//! cancels those in flight (which fail the same way) and joins the thread. A scheduler
//! holds the clone it was given, and a request holds its caller's scheduler (its
//! completer does), so a running request would keep both alive: each request therefore
//! ends early, answering nobody, once its scheduler is stopping.
//!
//! # The wire
//!
//! `http.request` takes `{"method": "GET", "url": "…", "headers": [["name", "value"]],
//! "body": "text"}` (`method` defaults to GET, `headers` to none; `body_base64` instead
//! of `body` for bytes) and answers `{"status": 200, "headers": [["name", "value"]],
//! "body": "…"}`, with `body_base64` instead of `body` when the body is not UTF-8.
//! Failures are `"<code>: <message>"` (see [`crate::provider`]): `denied`, `invalid`,
//! `limit`, `timeout`, `unavailable`. Header values that are not UTF-8 are answered
//! with `�` in place of the bad bytes.

#![cfg(feature = "http")]

mod address;
mod client;
mod lanes;
mod pattern;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustc_hash::FxHashSet;

use self::lanes::{Admit, Bounds, Caller, Lanes, Load};
use self::pattern::AllowList;
pub use self::pattern::HostPattern;
use self::wire::{Output, Prepared};
use crate::Handle;
use crate::handler::{Completer, Request};
use crate::provider::{ErrorCode, Failure, Provider};

/// The commands of the family, for [`unknown`](crate::provider::unknown).
const COMMANDS: [&str; 1] = ["request"];
/// The header a durable process's request carries its command's idempotency key in
/// (see the module docs).
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How long dropping the last [`Http`] waits for name lookups in progress (each blocks
/// a thread in `getaddrinfo`) before it leaves them to end on their own. Picked so
/// that a stop is never slow; a lookup left behind ends within the system's own DNS
/// timeout and returns to nothing.
const LOOKUP_GRACE: Duration = Duration::from_millis(500);

/// How often a running request checks whether its scheduler is stopping or its caller
/// has ended. Its completer holds the scheduler, and the scheduler holds this provider,
/// so a request left running would keep both (and this thread) alive until it ended on
/// its own; and a request of an ended caller holds its body for no one.
/// Picked so a stop frees them within a blink; a request slower than this wakes that
/// often (at the bound of 256 in flight, 2,560 wakeups a second), little beside the
/// requests themselves.
const STOP_POLL: Duration = Duration::from_millis(100);

/// What an [`Http`] allows and how much. The defaults allow no host.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// The hosts a request may reach. By default none.
    pub allow: Vec<HostPattern>,
    /// A whole request, from its start to its answer's last byte, redirects included.
    /// By default 30 s.
    pub timeout: Duration,
    /// The largest request body, in bytes. By default 1 MiB.
    pub max_request_body: usize,
    /// The largest answer body, in bytes. By default 8 MiB.
    pub max_response_body: usize,
    /// Redirects followed before a request fails `limit`. By default 5.
    pub max_redirects: usize,
    /// Requests of one process in flight at once. By default 8.
    pub max_in_flight_per_process: usize,
    /// Requests of one process waiting for a place; past them a request fails `limit`.
    /// By default 64.
    pub max_queued_per_process: usize,
    /// The bytes of the bodies of one process's requests waiting for a place; a request
    /// that would pass it fails `limit`. By default 8 MiB.
    pub max_queued_bytes_per_process: usize,
    /// Requests in flight at once across all processes. By default 256.
    pub max_in_flight: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            allow: Vec::new(),
            timeout: Duration::from_secs(30),
            max_request_body: 1 << 20,
            max_response_body: 8 << 20,
            max_redirects: 5,
            max_in_flight_per_process: 8,
            max_queued_per_process: 64,
            max_queued_bytes_per_process: 8 << 20,
            max_in_flight: 256,
        }
    }
}

/// The `http` provider: serves `http.request`. Cheap to clone (an [`Arc`] inside), so
/// one can be registered with several schedulers and share their bounds, thread and
/// connection pool.
///
/// Threads: `handle` runs on the worker that dispatched the command and only checks the
/// input and queues; the request runs on the provider's own thread (see the module
/// docs). Dropping the last clone stops that thread.
#[derive(Clone)]
pub struct Http {
    inner: Arc<Inner>,
    /// The hosts this handle's requests may reach: clones made with [`Http::within`]
    /// share everything else.
    allow: Arc<AllowList>,
}

/// The owner's side: stops the thread when the last [`Http`] goes.
struct Inner {
    core: Arc<Core>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What requests share, on any thread: each running request holds it.
struct Core {
    timeout: Duration,
    max_request_body: usize,
    max_response_body: usize,
    max_redirects: usize,
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    /// Locked only to count: no job is started, completed or dropped under it, since a
    /// completion may drop the last scheduler, and with it the last `Http`, whose drop
    /// locks this.
    lanes: Mutex<Lanes<Job>>,
    /// The processes told to release their lanes when they end (one release each, however
    /// many requests they make); a process leaves it as it ends.
    watched: Mutex<FxHashSet<Caller>>,
}

/// A request waiting for a place or running.
struct Job {
    request: Prepared,
    /// The allow-list of the handle that took it: redirects are checked against it.
    allow: Arc<AllowList>,
    reply: Reply,
    /// The caller's scheduler, to drop the request once it stops (see [`run`]).
    scheduler: Handle,
}

impl Http {
    /// Starts the provider's thread and its client.
    ///
    /// # Errors
    ///
    /// A bound of zero (`max_in_flight_per_process`, `max_in_flight`) or a zero
    /// `timeout`; or if the thread, the runtime or the client cannot be started.
    pub fn start(settings: HttpSettings) -> anyhow::Result<Http> {
        anyhow::ensure!(settings.max_in_flight_per_process > 0, "`max_in_flight_per_process` must be at least 1");
        anyhow::ensure!(settings.max_in_flight > 0, "`max_in_flight` must be at least 1");
        anyhow::ensure!(!settings.timeout.is_zero(), "`timeout` must be more than zero");
        let client = client::build()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("wasmproc-http-lookup")
            .build()
            .map_err(|e| anyhow::anyhow!("failed to start the http provider's runtime: {e}"))?;
        let bounds = Bounds {
            in_flight_per_process: settings.max_in_flight_per_process,
            queued_per_process: settings.max_queued_per_process,
            queued_bytes_per_process: settings.max_queued_bytes_per_process,
            in_flight: settings.max_in_flight,
        };
        let allow = Arc::new(AllowList::new(settings.allow));
        let core = Arc::new(Core {
            timeout: settings.timeout,
            max_request_body: settings.max_request_body,
            max_response_body: settings.max_response_body,
            max_redirects: settings.max_redirects,
            client,
            runtime: runtime.handle().clone(),
            lanes: Mutex::new(Lanes::new(bounds)),
            watched: Mutex::new(FxHashSet::default()),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("wasmproc-http".to_owned())
            .spawn(move || {
                // Tasks run only while this thread polls the runtime, until the stop.
                let _ = runtime.block_on(stopped);
                runtime.shutdown_timeout(LOOKUP_GRACE);
            })
            .map_err(|e| anyhow::anyhow!("failed to start the http provider's thread: {e}"))?;
        Ok(Http { inner: Arc::new(Inner { core, stop: Some(stop), thread: Some(thread) }), allow })
    }

    /// The same provider (its thread, client, bounds and settings) allowing `allow`
    /// instead: for hosts that grant each process its own hosts (the service's
    /// workflows), one thread for all of them.
    pub fn within(&self, allow: Vec<HostPattern>) -> Http {
        Http { inner: self.inner.clone(), allow: Arc::new(AllowList::new(allow)) }
    }
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http").field("allow", &self.allow).finish_non_exhaustive()
    }
}

impl Provider for Http {
    fn family(&self) -> &str {
        "http"
    }

    fn handle(&self, request: Request<'_>) {
        if request.name() != "http.request" {
            let failure = crate::provider::unknown(request.name(), "http", &COMMANDS);
            return request.complete(Err(failure.into()));
        }
        let core = &self.inner.core;
        let prepared = crate::provider::input(request.name(), request.payload())
            .and_then(|input| wire::prepare(input, &self.allow, core.max_request_body));
        let mut prepared = match prepared {
            Ok(prepared) => prepared,
            Err(failure) => return request.complete(Err(failure.into())),
        };
        if let Some(key) = request.idempotency_key()
            && !prepared.headers.contains_key(IDEMPOTENCY_KEY)
            && let Ok(value) = reqwest::header::HeaderValue::from_str(&key)
        {
            prepared.headers.insert(IDEMPOTENCY_KEY, value);
        }
        let scheduler = request.scheduler();
        let pid = Caller { scheduler: scheduler.id(), pid: request.caller() };
        let (_, completer) = request.into_parts();
        let job = Job { request: prepared, allow: self.allow.clone(), reply: Reply(Some(completer)), scheduler };
        core.submit(pid, job);
    }
}

impl Core {
    fn submit(self: &Arc<Self>, pid: Caller, job: Job) {
        if !self.watch(pid, &job) {
            // The caller is ending: nobody would read the answer.
            return;
        }
        let size = job.request.body.as_ref().map_or(0, |body| body.len());
        let (admitted, Load { in_flight, queued, queued_bytes }) = {
            let mut lanes = self.lanes.lock();
            let admitted = lanes.submit(pid, job, size);
            (admitted, lanes.load(pid))
        };
        match admitted {
            Admit::Start(job) => self.start(pid, job),
            Admit::Queued => {}
            Admit::Full(job) => job.reply.answer(Err(Failure::new(
                ErrorCode::Limit,
                format!(
                    "process {pid} has {in_flight} http requests in flight and {queued} queued ({queued_bytes} bytes \
                     of bodies, and this one's {size}), the most it may; wait for answers before sending more"
                ),
            ))),
            // Dropped, its reply says the provider stopped.
            Admit::Closed(job) => drop(job),
        }
    }

    /// Makes sure `pid`'s lane is let go when it ends ([`Core::forget`]). False if it is
    /// ending already.
    fn watch(self: &Arc<Self>, pid: Caller, job: &Job) -> bool {
        if !self.watched.lock().insert(pid) {
            return true;
        }
        let core = Arc::downgrade(self);
        let release = Box::new(move || {
            if let Some(core) = core.upgrade() {
                core.forget(pid);
            }
        });
        let Some(completer) = &job.reply.0 else { return true };
        match completer.on_caller_exit(release) {
            Ok(()) => true,
            Err(_) => {
                self.forget(pid);
                false
            }
        }
    }

    /// `pid` ended: its queued requests go now, unanswered (see the module docs).
    fn forget(&self, pid: Caller) {
        self.watched.lock().remove(&pid);
        let queued = self.lanes.lock().forget(pid);
        // Outside the lock, as every job's end (see `lanes`).
        drop(queued);
    }

    /// Runs `job`, which the lanes counted in flight, on the provider's thread.
    fn start(self: &Arc<Self>, pid: Caller, job: Job) {
        // After the runtime shut down, `spawn` drops the task, and the job's reply
        // answers `unavailable`.
        self.runtime.spawn(run(self.clone(), pid, job));
    }
}

/// One request's task. It ends early, dropping the request, once the caller's
/// scheduler is stopping or the caller has ended: nobody is left to read the answer.
async fn run(core: Arc<Core>, pid: Caller, job: Job) {
    // Frees the place even if the task is cancelled (the provider stopping).
    let _place = Place { core: core.clone(), pid };
    let Job { request, allow, reply, scheduler } = job;
    if scheduler.is_stopping() || reply.caller_has_ended() {
        return;
    }
    let origin = request.target.origin();
    let rules =
        client::Rules { allow: &allow, max_response_body: core.max_response_body, max_redirects: core.max_redirects };
    // One timer at a time serves both the timeout and the stop check: the request runs
    // in slices of at most `STOP_POLL`, and between two the scheduler is looked at.
    let deadline = tokio::time::Instant::now() + core.timeout;
    let mut request = std::pin::pin!(client::execute(&core.client, &rules, request));
    let result = loop {
        let slice_end = deadline.min(tokio::time::Instant::now() + STOP_POLL);
        match tokio::time::timeout_at(slice_end, &mut request).await {
            Ok(result) => break result,
            Err(_) if scheduler.is_stopping() || reply.caller_has_ended() => return,
            Err(_) if slice_end < deadline => continue,
            Err(_) => {
                break Err(Failure::new(
                    ErrorCode::Timeout,
                    format!("no complete answer from {origin} within {:?}", core.timeout),
                ));
            }
        }
    };
    if let Err(failure) = &result {
        tracing::debug!(%pid, origin, %failure, "http request failed");
    }
    reply.answer(result);
}

/// A place in flight, given back when its task ends.
struct Place {
    core: Arc<Core>,
    pid: Caller,
}

impl Drop for Place {
    fn drop(&mut self) {
        let next = self.core.lanes.lock().finish(self.pid);
        for (pid, job) in next {
            self.core.start(pid, job);
        }
    }
}

/// A request's completer: answered once, or on drop with `unavailable`, so a request
/// the provider drops (stopping) does not read as a handler's bug.
struct Reply(Option<Completer>);

impl Reply {
    fn caller_has_ended(&self) -> bool {
        self.0.as_ref().is_none_or(Completer::caller_has_ended)
    }

    fn answer(mut self, result: Result<Output, Failure>) {
        if let Some(completer) = self.0.take() {
            completer.complete(crate::provider::answer(result));
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(completer) = self.0.take() {
            let stopped = Failure::new(ErrorCode::Unavailable, "the http provider stopped before the request finished");
            completer.complete(Err(stopped.into()));
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let queued = self.core.lanes.lock().close();
        drop(queued);
        if let Some(stop) = self.stop.take() {
            // The thread may be gone already only if it panicked; its join says so.
            let _ = stop.send(());
        }
        let Some(thread) = self.thread.take() else { return };
        // The last `Http` can go on the provider's own thread: a completion there may
        // drop the last scheduler. That thread ends by itself once this returns.
        if thread.thread().id() == std::thread::current().id() {
            return;
        }
        if thread.join().is_err() {
            tracing::error!("the http provider's thread panicked");
        }
    }
}
