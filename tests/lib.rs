//! Native test processes shared by the integration tests.
//!
//! [`Scripted`] runs a closure per step and records what happened in a [`Probe`], so a
//! test can state a process's behaviour inline and check steps, events and closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use wasmproc::{Event, Events, Payload, Pid, Process, StepOutput};

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
        let process = Scripted { entries, probe: probe.clone(), body: Box::new(body), pid: Pid::HOST, input: vec![] };
        (process, probe)
    }

    /// The input given to `init`.
    pub fn input(&self) -> &[Payload] {
        &self.input
    }
}

impl Process for Scripted {
    fn init(&mut self, pid: Pid, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        if !self.entries.contains(&method) {
            anyhow::bail!("unknown entry method `{method}`; this process has: {}", self.entries.join(", "));
        }
        self.pid = pid;
        *self.probe.pid.lock() = Some(pid);
        self.input = input;
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let step = self.probe.steps.fetch_add(1, Ordering::SeqCst);
        let events: Vec<Event> = events.collect();
        self.probe.events.lock().extend(events.iter().cloned());
        (self.body)(&mut Turn { step, pid: self.pid, events, out })
    }

    fn close(&mut self) {
        self.probe.closes.fetch_add(1, Ordering::SeqCst);
    }
}

/// How long a test waits for something that should happen at once before it calls it a
/// hang. Generous: it bounds a failure, it does not measure anything.
pub const HANG: Duration = Duration::from_secs(20);

/// A completion event's result, if `event` is a completion with `tag`.
pub fn completion(event: &Event, tag: u64) -> Option<&wasmproc::Outcome> {
    match event {
        Event::Completion { tag: t, result } if *t == tag => Some(result),
        _ => None,
    }
}

/// A handler that completes at once, inside dispatch.
pub fn complete_now(request: wasmproc::Request) {
    request.complete(Ok(Payload::empty()));
}

/// A handler that hands each completer to the receiver, for the test to complete later.
pub fn stash() -> (impl wasmproc::Handler, std::sync::mpsc::Receiver<wasmproc::Completer>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handler = move |request: wasmproc::Request| {
        let (_, done) = request.into_parts();
        // The test may have stopped listening; then the completer's drop answers the yield.
        let _ = tx.send(done);
    };
    (handler, rx)
}

/// A custom command with an empty payload.
pub fn custom(name: &'static str) -> wasmproc::Command {
    wasmproc::Command::Custom { name: name.into(), payload: Payload::empty() }
}
