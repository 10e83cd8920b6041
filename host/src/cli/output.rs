//! Everything `wasmproc run` writes to its stdout and stderr, written so that no write
//! can take the host down or hold it up.
//!
//! 1. Each stream has a writer thread of its own, fed through a channel; nothing else
//!    writes to the stream. A worker that logs a guest's line, or the main thread that
//!    prints a result, only queues bytes: a stream nobody reads blocks its writer
//!    thread, never a worker or the main thread.
//! 2. A write that fails ends the writes to that stream: the rest is discarded. A closed
//!    stdout is remembered ([`Output::stdout_closed`]) so the run can exit with
//!    [`Exit::StdoutClosed`](super::Exit::StdoutClosed); a closed stderr leaves nowhere
//!    to say anything, and changes nothing else.
//! 3. Guest output is bounded: at most [`GUEST_BACKLOG`] bytes of it wait at once. Past
//!    that a guest's lines are dropped and counted ([`Output::dropped`]), and the count
//!    is reported at the end: guests cannot make the host hold their output without
//!    bound, and no line is lost without saying so. The host's own messages are few and
//!    always queued.
//! 4. [`Output::flush`] waits for both writers until a deadline, so a stream nobody reads
//!    cannot hold the host past `--timeout`.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::Instant;

/// Bytes of guest output that may wait for a slow stderr before lines are dropped. Enough
/// for a burst of thousands of lines; not a tuning knob.
pub(crate) const GUEST_BACKLOG: usize = 4 * 1024 * 1024;

/// The binary's two output streams. Cheap to clone; every clone feeds the same writers.
#[derive(Clone)]
pub(crate) struct Output {
    stdout: Arc<Stream>,
    stderr: Arc<Stream>,
}

enum Message {
    Bytes(Vec<u8>),
    /// Guest output: counted against [`GUEST_BACKLOG`] until written.
    Guest(Vec<u8>),
    /// Answered once everything queued before it is written (or discarded).
    Flush(mpsc::SyncSender<()>),
}

struct Stream {
    tx: Sender<Message>,
    /// Guest bytes queued and not yet written. `Relaxed`: a bound, not a synchronisation;
    /// a racing producer may overshoot it by one line.
    backlog: Arc<AtomicUsize>,
    /// A write failed: everything after it is discarded. `Relaxed`: read only for the
    /// exit code, after a flush whose answer orders it.
    closed: Arc<AtomicBool>,
    dropped: AtomicU64,
}

impl Stream {
    fn start(name: &str, mut sink: impl Write + Send + 'static) -> Stream {
        let (tx, rx) = mpsc::channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let (thread_backlog, thread_closed) = (backlog.clone(), closed.clone());
        let spawned = thread::Builder::new()
            .name(format!("wasmproc-{name}"))
            .spawn(move || write_all(&rx, &mut sink, &thread_backlog, &thread_closed));
        if spawned.is_err() {
            // Without its writer the stream takes nothing: every write is discarded, as
            // for a closed stream.
            closed.store(true, Ordering::Relaxed);
        }
        Stream { tx, backlog, closed, dropped: AtomicU64::new(0) }
    }

    fn send(&self, message: Message) {
        // The writer thread only ends when every sender is gone, so a send fails only if
        // the thread could not start; the stream then counts as closed.
        let _ = self.tx.send(message);
    }

    fn guest(&self, line: Vec<u8>) {
        let len = line.len();
        if self.backlog.load(Ordering::Relaxed) + len > GUEST_BACKLOG {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.backlog.fetch_add(len, Ordering::Relaxed);
        self.send(Message::Guest(line));
    }

    /// Waits until everything queued so far is written, or `deadline` passes: false then.
    fn flush(&self, deadline: Option<Instant>) -> bool {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Message::Flush(tx));
        match deadline {
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())).is_ok(),
            None => rx.recv().is_ok(),
        }
    }
}

/// The writer thread's loop: see the module docs.
fn write_all(rx: &Receiver<Message>, sink: &mut dyn Write, backlog: &AtomicUsize, closed: &AtomicBool) {
    for message in rx {
        let bytes = match message {
            Message::Bytes(bytes) => bytes,
            Message::Guest(bytes) => {
                backlog.fetch_sub(bytes.len(), Ordering::Relaxed);
                bytes
            }
            Message::Flush(done) => {
                if !closed.load(Ordering::Relaxed) && sink.flush().is_err() {
                    closed.store(true, Ordering::Relaxed);
                }
                let _ = done.send(());
                continue;
            }
        };
        if !closed.load(Ordering::Relaxed) && sink.write_all(&bytes).is_err() {
            closed.store(true, Ordering::Relaxed);
        }
    }
}

impl Output {
    /// Starts the writers of the process's stdout and stderr.
    pub(crate) fn start() -> Output {
        Output {
            stdout: Arc::new(Stream::start("stdout", std::io::stdout())),
            stderr: Arc::new(Stream::start("stderr", std::io::stderr())),
        }
    }

    /// Queues `bytes` for stdout.
    pub(crate) fn stdout(&self, bytes: Vec<u8>) {
        self.stdout.send(Message::Bytes(bytes));
    }

    /// Queues one line of the host's own for stderr.
    pub(crate) fn line(&self, text: impl Into<String>) {
        let mut bytes = text.into().into_bytes();
        bytes.push(b'\n');
        self.stderr.send(Message::Bytes(bytes));
    }

    /// Queues raw bytes for stderr (the progress line, which redraws itself).
    pub(crate) fn stderr_raw(&self, bytes: Vec<u8>) {
        self.stderr.send(Message::Bytes(bytes));
    }

    /// Queues a line of guest output for stderr, or drops it if [`GUEST_BACKLOG`] bytes
    /// already wait. Formatted straight into the queued buffer: one allocation a line.
    pub(crate) fn guest_line(&self, line: impl std::fmt::Display) {
        let mut bytes = Vec::new();
        // Writing into a `Vec` cannot fail.
        let _ = writeln!(bytes, "{line}");
        self.stderr.guest(bytes);
    }

    /// Guest lines dropped so far because stderr was not read fast enough.
    pub(crate) fn dropped(&self) -> u64 {
        self.stderr.dropped.load(Ordering::Relaxed)
    }

    /// Waits until everything queued so far is written, or until `deadline`: false if
    /// the deadline came first.
    pub(crate) fn flush(&self, deadline: Option<Instant>) -> bool {
        // stdout first: it holds the result, and stderr may be the stream nobody reads.
        self.stdout.flush(deadline) && self.stderr.flush(deadline)
    }

    /// Whether a write to stdout failed (the reader closed it). Settled once a
    /// [`Output::flush`] has returned true.
    pub(crate) fn stdout_closed(&self) -> bool {
        self.stdout.closed.load(Ordering::Relaxed)
    }
}

/// Writes `text` to stdout at once, from the calling thread: for the subcommands that
/// print once and exit (`inspect`, `compile`), where a blocked stdout blocks nothing else.
/// `Err` if the write failed: stdout was closed.
pub(crate) fn print_now(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// Writes one line to stderr at once, ignoring failure: there is nowhere else to report
/// that stderr is closed.
pub(crate) fn eprint_now(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(line.as_bytes()).and_then(|()| stderr.write_all(b"\n"));
}

/// The `tracing` subscriber of the binary: the library's own events (a refused cache
/// entry, say) as `wasmproc: warning: …` lines on stderr, at `warn` and above unless
/// `RUST_LOG` says otherwise. A failed write is ignored (as `eprint_now` does), never a
/// panic.
pub(crate) fn install_tracing() {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .without_time()
        .with_target(false)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .finish();
    // Fails only if a subscriber is installed already, which nothing else does.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink whose writes fail after `ok` bytes, as a pipe does once its reader is gone.
    struct Closing {
        ok: usize,
        written: Arc<parking_lot::Mutex<Vec<u8>>>,
    }

    impl Write for Closing {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let mut written = self.written.lock();
            if written.len() + bytes.len() > self.ok {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            written.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_stream_discards_the_rest_and_says_so() {
        let written = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let stream = Stream::start("test", Closing { ok: 6, written: written.clone() });
        stream.send(Message::Bytes(b"hello\n".to_vec()));
        stream.send(Message::Bytes(b"world\n".to_vec()));
        stream.send(Message::Bytes(b"!\n".to_vec()));
        assert!(stream.flush(None));
        assert!(stream.closed.load(Ordering::Relaxed));
        assert_eq!(*written.lock(), b"hello\n");
    }

    /// A writer that blocks until told to go on, as a pipe nobody reads does.
    struct Stuck(Receiver<()>);

    impl Write for Stuck {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn guest_output_past_the_backlog_is_dropped_and_counted_and_flush_has_a_deadline() {
        let (go, wait) = mpsc::channel();
        let stream = Stream::start("test", Stuck(wait));
        let line = vec![b'x'; 1024];
        let lines = GUEST_BACKLOG / line.len() + 10;
        for _ in 0..lines {
            stream.guest(line.clone());
        }
        // The writer holds at most one line it took off the queue; the rest wait, up to
        // the bound.
        let dropped = stream.dropped.load(Ordering::Relaxed);
        assert!((9..=11).contains(&dropped), "dropped {dropped} of {lines}");
        assert!(!stream.flush(Some(Instant::now() + std::time::Duration::from_millis(50))), "the writer is stuck");
        drop(go);
        assert!(stream.flush(None), "the writer goes on once the stream moves");
        assert_eq!(stream.backlog.load(Ordering::Relaxed), 0);
    }
}
