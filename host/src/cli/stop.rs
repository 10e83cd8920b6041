//! How a run ends early: the signals that stop it (SIGINT, SIGTERM, SIGHUP), its
//! timeout, and the graceful stop both lead to (cancel, `--grace`, terminate).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use wasmproc::scheduler::ProcessHandle;
use wasmproc::{ExitReason, Scheduler};

use super::report::Ended;

use super::output::{Output, Say};
use super::units::count;
use super::{Exit, Failure};

/// How long a run that was stopped waits for its output to be written, past its
/// `--timeout`, before it exits all the same: a stream nobody reads cannot hold it.
pub(super) const FLUSH_AFTER_STOP: Duration = Duration::from_millis(200);

/// How long, after the grace period and the terminations, a stopped run waits for its
/// workers' steps to return before exiting without them: a step blocked in a write to a
/// stream nobody reads (a WASI command's own stdout) never returns.
const STEPS_AFTER_STOP: Duration = Duration::from_millis(200);

/// How long a stopped run waits for the entry process's result to reach it once the
/// process has ended (or for good, if a step is stuck).
const JOIN_AFTER_STOP: Duration = Duration::from_millis(200);

/// How long after the entry process ends the run waits quietly for the processes it
/// spawned before saying that it is still waiting.
const NOTICE_AFTER: Duration = Duration::from_secs(2);

enum Signal {
    /// The entry process ended with this.
    Done(Ended),
    /// SIGINT, SIGTERM or SIGHUP: the first one (a second ends the host at once).
    Stop(i32),
}

/// Why a run was stopped before everything in it ended.
#[derive(Clone, Copy)]
pub(super) enum Stop {
    Timeout(Duration),
    Signal(i32),
}

impl Stop {
    pub(super) fn exit(self) -> Exit {
        match self {
            Stop::Timeout(_) => Exit::Timeout,
            Stop::Signal(signal_hook::consts::SIGHUP) => Exit::HungUp,
            Stop::Signal(signal_hook::consts::SIGTERM) => Exit::Terminated,
            Stop::Signal(_) => Exit::Interrupted,
        }
    }

    /// The cancel reason processes get, and the error of an entry process that had no
    /// result.
    pub(super) fn reason(self) -> String {
        match self {
            Stop::Timeout(timeout) => format!("timed out after {}", humantime::format_duration(timeout)),
            Stop::Signal(signal_hook::consts::SIGHUP) => "hung up (SIGHUP)".to_owned(),
            Stop::Signal(signal_hook::consts::SIGTERM) => "terminated (SIGTERM)".to_owned(),
            Stop::Signal(_) => "interrupted".to_owned(),
        }
    }

    /// What the `--json` object says in its `"stopped"` field.
    pub(super) fn name(self) -> &'static str {
        match self {
            Stop::Timeout(_) => "timeout",
            Stop::Signal(signal_hook::consts::SIGHUP) => "SIGHUP",
            Stop::Signal(signal_hook::consts::SIGTERM) => "SIGTERM",
            Stop::Signal(_) => "SIGINT",
        }
    }
}

/// The run's one channel: the entry process's end and the first signal arrive on it.
pub(super) struct Signals {
    tx: mpsc::Sender<Signal>,
    rx: mpsc::Receiver<Signal>,
    /// Set once the scheduler runs: a signal before that ends the host at once.
    started: Arc<AtomicBool>,
}

impl Signals {
    /// Forwards SIGINT, SIGTERM and SIGHUP to the channel from a thread of its own. The
    /// first one stops the run gracefully; a second, or one that comes before any process
    /// has started (while compiling, say), ends the host at once with its exit code.
    pub(super) fn listen() -> Result<Signals, Failure> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let (tx, rx) = mpsc::channel();
        let started = Arc::new(AtomicBool::new(false));
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .map_err(|e| Failure::new(Exit::Host, format!("cannot handle signals: {e}")))?;
        let (forward, ready) = (tx.clone(), started.clone());
        thread::Builder::new()
            .name("wasmproc-signals".to_owned())
            .spawn(move || {
                let mut first = true;
                for signal in signals.forever() {
                    // `SeqCst` with the store in `started`: a signal after the
                    // scheduler started is always forwarded, never an exit.
                    if !first || !ready.load(Ordering::SeqCst) {
                        std::process::exit(128 + signal);
                    }
                    first = false;
                    let _ = forward.send(Signal::Stop(signal));
                }
            })
            .map_err(|e| Failure::new(Exit::Host, format!("cannot start the signal thread: {e}")))?;
        Ok(Signals { tx, rx, started })
    }

    /// From here on a first signal stops the run gracefully.
    pub(super) fn started(&self) {
        self.started.store(true, Ordering::SeqCst);
    }

    /// Sends the entry process's result to the channel when it ends, from a thread that
    /// waits for it. That thread stays blocked in `join` if the run ends early; the
    /// process's end (at shutdown at the latest) releases it, and the send to a dropped
    /// channel is ignored.
    pub(super) fn forward_end_of(&self, process: ProcessHandle) {
        self.forward_result(move || Ended::of(process.pid(), process.wait()));
    }

    /// Sends what `join` returns (the entry process's result, however it is waited for)
    /// to the channel, from a thread that waits for it, as [`Signals::forward_end_of`].
    pub(super) fn forward_result(&self, join: impl FnOnce() -> Ended + Send + 'static) {
        let tx = self.tx.clone();
        thread::spawn(move || {
            let _ = tx.send(Signal::Done(join()));
        });
    }

    /// Waits for the entry process's result, or for what stops the run first (a signal,
    /// or `deadline`, which `timeout` set).
    pub(super) fn wait_for_entry(&self, deadline: Option<Instant>, timeout: Option<Duration>) -> Result<Ended, Stop> {
        self.wait_for_root(deadline, timeout)
    }

    /// The entry process's result if it arrives by `until`; signals meanwhile are
    /// ignored (the run is stopping already, and a second one ends the host at once).
    pub(super) fn entry_result_by(&self, until: Instant) -> Option<Ended> {
        loop {
            match self.recv(Some(until)) {
                Ok(Signal::Done(outcome)) => return Some(outcome),
                Ok(Signal::Stop(_)) => {}
                Err(_) => return None,
            }
        }
    }

    /// Waits for the entry process and then for everything it spawned, or for what stops
    /// the run first: the entry process's result if it has one, and why the run was
    /// stopped if it was.
    pub(super) fn wait(
        &self,
        scheduler: &Scheduler,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
        out: &Output,
    ) -> (Option<Ended>, Option<Stop>) {
        match self.wait_for_root(deadline, timeout) {
            Ok(outcome) => (Some(outcome), self.wait_for_rest(scheduler, deadline, timeout, out).err()),
            Err(early) => (None, Some(early)),
        }
    }

    fn recv(&self, until: Option<Instant>) -> Result<Signal, RecvTimeoutError> {
        match until {
            Some(at) => self.rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        }
    }

    fn wait_for_root(&self, deadline: Option<Instant>, timeout: Option<Duration>) -> Result<Ended, Stop> {
        match self.recv(deadline) {
            Ok(Signal::Done(outcome)) => Ok(outcome),
            Ok(Signal::Stop(signal)) => Err(Stop::Signal(signal)),
            Err(RecvTimeoutError::Timeout) => Err(Stop::Timeout(timeout.unwrap_or_default())),
            // The joining thread always sends before it ends.
            Err(RecvTimeoutError::Disconnected) => Ok(Ended::not_started("the entry process vanished".to_owned())),
        }
    }

    /// Waits `delay` (a retry's backoff), or until what stops the run first.
    pub(super) fn pause(
        &self,
        delay: Duration,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> Result<(), Stop> {
        let until = Instant::now().checked_add(delay);
        let (until, timed_out) = match (until, deadline) {
            (Some(until), Some(deadline)) if deadline < until => (Some(deadline), true),
            (None, deadline) => (deadline, deadline.is_some()),
            (until, _) => (until, false),
        };
        loop {
            match self.recv(until) {
                Ok(Signal::Stop(signal)) => return Err(Stop::Signal(signal)),
                // A result of a scheduler that has stopped: none is forwarded after it.
                Ok(Signal::Done(_)) => {}
                Err(RecvTimeoutError::Timeout) if timed_out => return Err(Stop::Timeout(timeout.unwrap_or_default())),
                Err(_) => return Ok(()),
            }
        }
    }

    /// Waits for the processes the entry process left behind; `Ok` when all have ended.
    pub(super) fn wait_for_rest(
        &self,
        scheduler: &Scheduler,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
        out: &Output,
    ) -> Result<(), Stop> {
        let since = Instant::now();
        let mut noticed = false;
        loop {
            if scheduler.handle().wait_idle(Some(Duration::from_millis(50))) {
                return Ok(());
            }
            if let Ok(Signal::Stop(signal)) = self.rx.try_recv() {
                return Err(Stop::Signal(signal));
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                return Err(Stop::Timeout(timeout.unwrap_or_default()));
            }
            if !noticed && since.elapsed() >= NOTICE_AFTER {
                noticed = true;
                out.say(
                    Say::Notice,
                    format!(
                        "the entry process has ended; waiting for {} it spawned (Ctrl-C or --timeout to stop \
                     them)",
                        processes(scheduler.handle().live())
                    ),
                );
            }
        }
    }

    /// Stops the run for `stop`: cancels every process, waits up to `grace` for them to
    /// end, then terminates the rest. Returns the entry process's result: `root`, or the
    /// one it gave when cancelled or terminated just now. A second signal never reaches
    /// here: it ends the host at once.
    pub(super) fn stop_gracefully(
        &self,
        scheduler: &Scheduler,
        stop: Stop,
        grace: Duration,
        out: &Output,
        mut root: Option<Ended>,
    ) -> Option<Ended> {
        let what = match stop {
            Stop::Timeout(_) => stop.reason(),
            Stop::Signal(_) => format!("{} (again to force)", stop.reason()),
        };
        if scheduler.handle().is_durable() {
            // Nothing is cancelled: the processes are suspended where their journal has
            // them, and the same command resumes them.
            out.say(
                Say::Notice,
                format!(
                    "{}: suspending {}; run the same command again to resume",
                    stop.reason(),
                    processes(scheduler.handle().live())
                ),
            );
            scheduler.stop(Duration::ZERO);
            return root;
        }
        out.say(Say::Notice, format!("{what}: stopping {}", processes(scheduler.handle().live())));
        scheduler.handle().cancel_all(&stop.reason());
        let until = Instant::now().checked_add(grace);
        let mut ended = false;
        while until.is_none_or(|until| Instant::now() < until) {
            if scheduler.handle().wait_idle(Some(Duration::from_millis(20))) {
                ended = true;
                break;
            }
        }
        if !ended {
            let forced = scheduler.handle().terminate_all(ExitReason::Killed);
            if forced > 0 {
                out.say(Say::Notice, format!("terminated {} that did not end when cancelled", processes(forced)));
            }
        }
        // The joining thread sends the entry process's result soon after it ends, unless
        // a step is stuck for good.
        let until = Instant::now() + JOIN_AFTER_STOP;
        while root.is_none() {
            match self.recv(Some(until)) {
                Ok(Signal::Done(outcome)) => root = Some(outcome),
                Ok(Signal::Stop(_)) => {}
                Err(_) => break,
            }
        }
        root
    }
}

/// Stops the scheduler and joins its threads, unless the run was `stopped` and steps are
/// still running once [`STEPS_AFTER_STOP`] has passed: a step blocked outside Wasm (in
/// a system call) would hold `stop` for good, so the host exits without joining them.
pub(super) fn shut_down(scheduler: Scheduler, stopped: bool, out: &Output) {
    if !stopped || scheduler.handle().wait_idle(Some(STEPS_AFTER_STOP)) {
        scheduler.stop(Duration::ZERO);
    } else {
        out.say(Say::Warning, "exiting with steps still running (blocked outside Wasm)");
        std::mem::forget(scheduler);
    }
}

/// "1 process", "3 processes".
fn processes(n: usize) -> String {
    if n == 1 { "1 process".to_owned() } else { format!("{} processes", count(n as u64)) }
}
