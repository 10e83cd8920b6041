//! Native test processes shared by the integration tests.
//!
//! [`Scripted`] runs a closure per step and records what happened in a [`Probe`], so a
//! test can state a process's behaviour inline and check steps, events and closes. Also
//! the README's demo ([`demo`], run by its example and by a test) and the paths of the
//! example guests this crate's build script builds ([`guests`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use wasmproc::{Event, Events, Payload, Pid, Port, Process, StepOutput};

pub mod demo;

/// What a scripted process went through.
#[derive(Default)]
pub struct Probe {
    steps: AtomicUsize,
    closes: AtomicUsize,
    events: Mutex<Vec<Event>>,
    pid: Mutex<Option<Pid>>,
}

impl Probe {
    /// Steps run so far.
    pub fn steps(&self) -> usize {
        self.steps.load(Ordering::SeqCst)
    }

    /// Times `close` was called.
    pub fn closes(&self) -> usize {
        self.closes.load(Ordering::SeqCst)
    }

    /// Every event delivered so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// The tags of the completions delivered so far, in order.
    pub fn completion_tags(&self) -> Vec<u64> {
        self.events
            .lock()
            .iter()
            .filter_map(|e| match e {
                Event::Completion { tag, .. } => Some(*tag),
                _ => None,
            })
            .collect()
    }

    /// The pid given to `init`.
    pub fn pid(&self) -> Option<Pid> {
        *self.pid.lock()
    }
}

/// One step of a scripted process.
pub struct Turn<'a> {
    /// 0 for the first step.
    pub step: usize,
    /// The process's own pid.
    pub pid: Pid,
    /// The process's port: it sends as itself through it during the step.
    pub port: &'a Port,
    /// The input given to `init`.
    pub input: &'a [Payload],
    /// The events of this step.
    pub events: Vec<Event>,
    /// Where the step writes.
    pub out: &'a mut StepOutput,
}

type Body = Box<dyn FnMut(&mut Turn<'_>) -> anyhow::Result<()> + Send>;

/// A process whose steps are a closure.
pub struct Scripted {
    entries: &'static [&'static str],
    probe: Arc<Probe>,
    body: Body,
    pid: Pid,
    port: Option<Port>,
    input: Vec<Payload>,
}

impl Scripted {
    /// A process with the single entry method `main` that runs `body` each step.
    pub fn new(body: impl FnMut(&mut Turn<'_>) -> anyhow::Result<()> + Send + 'static) -> (Self, Arc<Probe>) {
        Self::with_entries(&["main"], body)
    }

    /// A process with the given entry methods.
    pub fn with_entries(
        entries: &'static [&'static str],
        body: impl FnMut(&mut Turn<'_>) -> anyhow::Result<()> + Send + 'static,
    ) -> (Self, Arc<Probe>) {
        let probe = Arc::new(Probe::default());
        let process =
            Scripted { entries, probe: probe.clone(), body: Box::new(body), pid: Pid::HOST, port: None, input: vec![] };
        (process, probe)
    }

    /// The input given to `init`.
    pub fn input(&self) -> &[Payload] {
        &self.input
    }
}

impl Process for Scripted {
    fn init(&mut self, port: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        if !self.entries.contains(&method) {
            anyhow::bail!("unknown entry method `{method}`; this process has: {}", self.entries.join(", "));
        }
        let pid = port.pid();
        self.pid = pid;
        self.port = Some(port);
        *self.probe.pid.lock() = Some(pid);
        self.input = input;
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let step = self.probe.steps.fetch_add(1, Ordering::SeqCst);
        let events: Vec<Event> = events.collect();
        self.probe.events.lock().extend(events.iter().cloned());
        let port = self.port.as_ref().expect("`step` comes after a successful `init`");
        (self.body)(&mut Turn { step, pid: self.pid, port, input: &self.input, events, out })
    }

    fn close(&mut self) {
        self.probe.closes.fetch_add(1, Ordering::SeqCst);
    }
}

/// The example guests' `.wasm` files, built by this crate's build script (`build.rs`),
/// for tests outside this crate: the host's CLI tests.
pub mod guests {
    /// `examples-wasm/bench`.
    pub const BENCH: &str = env!("GUEST_BENCH");
    /// `examples-wasm/counter`.
    pub const COUNTER: &str = env!("GUEST_COUNTER");
    /// `examples-wasm/durable`.
    pub const DURABLE: &str = env!("GUEST_DURABLE");
    /// `examples-wasm/fan-out`.
    pub const FAN_OUT: &str = env!("GUEST_FAN_OUT");
    /// `examples-wasm/fetcher`.
    pub const FETCHER: &str = env!("GUEST_FETCHER");
    /// `examples-wasm/hello`.
    pub const HELLO: &str = env!("GUEST_HELLO");
    /// `examples-wasm/hostile`.
    pub const HOSTILE: &str = env!("GUEST_HOSTILE");
    /// `examples-wasm/inventory`.
    pub const INVENTORY: &str = env!("GUEST_INVENTORY");
    /// `examples-wasm/ledger`.
    pub const LEDGER: &str = env!("GUEST_LEDGER");
    /// `examples-wasm/notes`.
    pub const NOTES: &str = env!("GUEST_NOTES");
    /// `examples-wasm/sdk-tour`.
    pub const SDK_TOUR: &str = env!("GUEST_SDK_TOUR");
    /// `examples-wasm/supervised`.
    pub const SUPERVISED: &str = env!("GUEST_SUPERVISED");
    /// `examples-wasm/timers`.
    pub const TIMERS: &str = env!("GUEST_TIMERS");
    /// `examples-wasm/waiter`.
    pub const WAITER: &str = env!("GUEST_WAITER");
    /// `examples-wasm/wasi-cli`.
    pub const WASI_CLI: &str = env!("GUEST_WASI_CLI");
    /// `examples-wasm/workflow`.
    pub const WORKFLOW: &str = env!("GUEST_WORKFLOW");
    /// `examples-python/squares.py`, built with componentize-py.
    pub const PY_SQUARES: &str = env!("GUEST_PY_SQUARES");
    /// `examples-js/squares.js`, built with componentize-js.
    pub const JS_SQUARES: &str = env!("GUEST_JS_SQUARES");
}

/// Spawn-to-result times of a thousand well-behaved processes: `add` of the kind `hello`
/// (`examples-wasm/hello`, which `s` must have), ten spawned at a time, each result
/// checked; `phase` gives each thousand inputs of its own. What the sandbox test and the
/// tail benchmark time beside hostile guests.
pub fn good_thousand(s: &wasmproc::Scheduler, phase: u32) -> Vec<Duration> {
    use wasmproc::scheduler::{SpawnOptions, Spawnable};
    let mut latencies = Vec::with_capacity(1000);
    for batch in 0..100u32 {
        let started = std::time::Instant::now();
        let good: Vec<_> = (0..10u32)
            .map(|i| {
                let n = phase * 1000 + batch * 10 + i;
                let input = vec![Payload::json(&[n, 1]).expect("two numbers")];
                let options = SpawnOptions::new("add").input(input);
                (n, s.handle().spawn(Spawnable::kind("hello"), options).expect("a good one starts"))
            })
            .collect();
        for (n, process) in good {
            let result = process.join_timeout(HANG).expect("a good process ends").expect("and succeeds");
            assert_eq!(result.as_str(), Some((n + 1).to_string().as_str()));
            latencies.push(started.elapsed());
        }
    }
    latencies
}

/// How long a test waits for something that should happen at once before it calls it a
/// hang. Generous: it bounds a failure, it does not measure anything.
pub const HANG: Duration = Duration::from_secs(20);

/// A completion event's result, if `event` is a completion with `tag`.
/// The words of an abnormal end, as tests compare them: an error's own text, a trap's
/// message, or the reason's sentence (`was terminated`) for the others.
pub fn said(reason: wasmproc::ExitReason) -> String {
    match reason {
        wasmproc::ExitReason::Error(error) => error,
        wasmproc::ExitReason::Trap(trap) => trap.message,
        other => other.to_string(),
    }
}

/// The record of a normal end with `payload`, as a journal's history holds it.
pub fn normal(payload: Payload) -> Option<wasmproc::Exited> {
    Some(wasmproc::Exited::new(wasmproc::ExitReason::Normal(payload)))
}

pub fn completion(event: &Event, tag: u64) -> Option<&wasmproc::Outcome> {
    match event {
        Event::Completion { tag: t, result } if *t == tag => Some(result),
        _ => None,
    }
}

/// Runs one process on `handle` that yields `command` (tag 1), with `caps` if given, and
/// returns the completion it got.
pub fn outcome_of(
    handle: &wasmproc::Handle,
    caps: Option<wasmproc::Capabilities>,
    command: wasmproc::Command,
) -> wasmproc::Outcome {
    yield_one(handle, caps, command).1
}

/// As [`outcome_of`], with the pid of the process that yielded the command.
pub fn yield_one(
    handle: &wasmproc::Handle,
    caps: Option<wasmproc::Capabilities>,
    command: wasmproc::Command,
) -> (Pid, wasmproc::Outcome) {
    let (p, probe) = Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(1, command.clone());
        } else {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    let mut options = wasmproc::scheduler::SpawnOptions::new("main");
    if let Some(caps) = caps {
        options = options.capabilities(caps);
    }
    let process = handle.spawn(p, options).expect("the process starts");
    process.join_timeout(HANG).expect("it ends").expect("it succeeds");
    let events = probe.events();
    let outcome = completion(events.first().expect("the completion woke it"), 1).expect("a completion of tag 1");
    (process.pid(), outcome.clone())
}

/// A handler that completes at once, inside dispatch.
pub fn complete_now(request: wasmproc::handler::Request) {
    request.complete(Ok(Payload::empty()));
}

/// A handler that hands each completer to the receiver, for the test to complete later.
pub fn stash() -> (impl wasmproc::handler::Handler, std::sync::mpsc::Receiver<wasmproc::handler::Completer>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handler = move |request: wasmproc::handler::Request| {
        let (_, done) = request.into_parts();
        // The test may have stopped listening; then the completer's drop answers the yield.
        let _ = tx.send(done);
    };
    (handler, rx)
}

/// Yields the custom command `now` (tagged with what is left) until it has had `left`
/// completions, then completes: the yield cycle of the benchmarks and `tests/alloc`.
pub struct Yielder {
    pub left: u64,
}

impl Process for Yielder {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if self.left == 0 {
            out.complete(Ok(Payload::empty()));
        } else {
            self.left -= 1;
            out.yield_command(self.left, custom("now"));
        }
        Ok(())
    }
}

/// A custom command with an empty payload.
pub fn custom(name: &'static str) -> wasmproc::Command {
    wasmproc::Command::Custom { name: name.into(), payload: Payload::empty() }
}

/// A point where a step stops until the test lets it go on: the test learns when a step
/// has reached it ([`Gate::wait_reached`]) and decides when it continues ([`Gate::open`]).
/// With one worker, whatever is queued meanwhile stays queued.
pub struct Gate {
    reached: std::sync::mpsc::Receiver<()>,
    open: std::sync::mpsc::Sender<()>,
}

/// The process's side of a [`Gate`].
pub struct GateStop {
    reached: std::sync::mpsc::Sender<()>,
    open: std::sync::mpsc::Receiver<()>,
}

/// A new gate and the stop a process waits at.
pub fn gate() -> (Gate, GateStop) {
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (open, open_rx) = std::sync::mpsc::channel();
    (Gate { reached, open }, GateStop { reached: reached_tx, open: open_rx })
}

impl Gate {
    /// Blocks until a step reached the stop (or [`HANG`] passes: then panics).
    pub fn wait_reached(&self) {
        self.reached.recv_timeout(HANG).expect("no step reached the gate");
    }

    /// Lets the waiting step go on.
    pub fn open(&self) {
        self.open.send(()).expect("the process waiting at the gate is gone");
    }
}

impl GateStop {
    /// Called from a step: reports arrival, then waits until the test opens the gate.
    pub fn wait(&self) {
        self.reached.send(()).expect("the test holding the gate is gone");
        self.open.recv().expect("the test holding the gate is gone");
    }
}

/// A process that holds its worker in its first step until the gate opens, then completes.
pub fn holder() -> (Scripted, Gate) {
    let (gate, stop) = gate();
    let (process, _) = Scripted::new(move |t| {
        stop.wait();
        t.out.complete(Ok(Payload::empty()));
        Ok(())
    });
    (process, gate)
}

/// A scheduler builder with `workers` workers and the [`stash`] handler registered and
/// granted under the name `stash`.
pub fn with_stash(
    workers: usize,
) -> (wasmproc::scheduler::Builder, std::sync::mpsc::Receiver<wasmproc::handler::Completer>) {
    let (handler, stashed) = stash();
    let builder = wasmproc::Scheduler::builder()
        .workers(workers)
        .capabilities(wasmproc::Capabilities::default().allow("stash"))
        .handler("stash", handler);
    (builder, stashed)
}

/// A child process killed (and waited for) on drop: a node or a client a test started.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Measuring for the benchmarks: samples, medians, paired runs.
pub mod bench;
/// A headless chromium driven through WebDriver, for the console's tests and benchmark.
pub mod browser;
/// A file system that stalls every write (frozen), for the providers' tests.
pub mod frozen;
/// A real `nats-server` on loopback for the cluster's tests and benchmark.
pub mod nats;
/// An HTTP server on loopback recording what it is sent, for side effects counted.
pub mod recorder;
/// A `wasmproc serve` on loopback for the CLI tests and the service benchmark.
pub mod served;
/// A real HTTP server on loopback serving a directory.
pub mod site;
