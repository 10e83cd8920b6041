//! Everything `wasmproc` writes to its stdout and stderr, written so that no write can
//! take the host down or hold it up, and in the shape the global flags ask for.
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
//!
//! # Logging
//!
//! The global flags ([`Logging`]) are read once, before anything is written, into a
//! process-wide [`Style`]: `-q` keeps the host's errors only (its notices and warnings,
//! and the library's `tracing` events below `error`, are dropped), and `--log-format
//! json` writes every line of the host's own on stderr (its messages, the library's
//! events, guest log lines, the `--stats` summary) as one JSON object. The library never
//! writes to a stream: it logs through `tracing`, whose subscriber is installed here.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Instant, SystemTime};

use clap::{ArgAction, Args, ValueEnum};
use serde_json::{Map, Value, json};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use wasmproc::wasm::{Escaped, LogRecord, LogSource};

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
    /// The live line (`--progress`), drawn over itself: its bytes start with [`ERASE`],
    /// and are only that to take it away.
    Live(Vec<u8>),
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

/// What takes a line on a terminal away: back to its start, and clear it.
pub(crate) const ERASE: &[u8] = b"\r\x1b[K";

/// The writer thread's loop: see the module docs. A live line on the stream is erased
/// before anything else is written, so that no line starts after it.
fn write_all(rx: &Receiver<Message>, sink: &mut dyn Write, backlog: &AtomicUsize, closed: &AtomicBool) {
    let mut live = false;
    for message in rx {
        let bytes = match message {
            Message::Bytes(bytes) if live => {
                live = false;
                [ERASE, &bytes].concat()
            }
            Message::Bytes(bytes) => bytes,
            Message::Live(bytes) => {
                live = bytes != ERASE;
                bytes
            }
            Message::Guest(bytes) => {
                backlog.fetch_sub(bytes.len(), Ordering::Relaxed);
                if live {
                    live = false;
                    [ERASE, &bytes].concat()
                } else {
                    bytes
                }
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

    /// Queues a message of the host's own for stderr, as [`Style`] has it: text (`error:
    /// …`, `wasmproc: …`) or a JSON object, and nothing for a notice or a warning under
    /// `-q`.
    pub(crate) fn say(&self, level: Say, text: impl AsRef<str>) {
        self.say_with(level, text.as_ref(), Map::new());
    }

    /// [`Output::say`] with `fields`, which only the JSON form shows.
    pub(crate) fn say_with(&self, level: Say, text: &str, fields: Map<String, Value>) {
        if let Some(line) = style().message(level, "wasmproc", text, fields) {
            self.stderr.send(Message::Bytes(line.into_bytes()));
        }
    }

    /// Queues a line of the host's own for stderr as it is, whatever the style: the
    /// `--stats` summary in text.
    pub(crate) fn text_line(&self, text: impl Into<String>) {
        let mut bytes = text.into().into_bytes();
        bytes.push(b'\n');
        self.stderr.send(Message::Bytes(bytes));
    }

    /// Queues a redraw of the live line on stderr (`--progress`): `bytes` start with
    /// [`ERASE`], and are only that to take the line away. Whatever stderr gets next is
    /// written after the line is erased.
    pub(crate) fn live_line(&self, bytes: Vec<u8>) {
        self.stderr.send(Message::Live(bytes));
    }

    /// Queues a line of guest output for stderr (`[pid 7] stdout: …`, or a JSON object
    /// with `--log-format json`), or drops it if [`GUEST_BACKLOG`] bytes already wait.
    /// Formatted straight into the queued buffer: one allocation a line.
    pub(crate) fn guest_line(&self, record: &LogRecord<'_>) {
        let mut bytes = Vec::new();
        // Writing into a `Vec` cannot fail.
        let _ = if style().json {
            let level = match record.source {
                LogSource::Log(level) => level.as_str(),
                LogSource::Stdout => "info",
                LogSource::Stderr => "warn",
            };
            let mut object = json!({
                "time": unix_time(),
                "level": level,
                "target": "wasmproc::guest",
                "pid": record.pid.as_u64(),
                "source": record.source.to_string(),
                "message": record.message,
            });
            if record.replayed {
                object["replayed"] = Value::Bool(true);
            }
            writeln!(bytes, "{}", json_line(&object))
        } else {
            writeln!(bytes, "{record}")
        };
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

/// Writes a message of the host's own to stderr at once (as [`Output::say`] formats it),
/// ignoring failure: there is nowhere else to report that stderr is closed. For what is
/// said before or without an [`Output`]: the final error, `compile`'s report.
pub(crate) fn say_now(level: Say, text: &str) {
    if let Some(line) = style().message(level, "wasmproc", text, Map::new()) {
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// How important a message of the host's own is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Say {
    /// Why wasmproc or a process failed: shown whatever the flags.
    Error,
    /// Something the user should act on; hidden by `-q`.
    Warning,
    /// What the host is doing (resuming, stopping, compiling); hidden by `-q`.
    Notice,
    /// What a flag asked for (the `--stats` summary): shown whatever `-q` says.
    Report,
}

impl Say {
    fn level(self) -> &'static str {
        match self {
            Say::Error => "error",
            Say::Warning => "warn",
            Say::Notice | Say::Report => "info",
        }
    }
}

/// The format of the host's lines on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Lines of text: `error: …`, `wasmproc: …`, `[pid 7] stdout: …`, ` WARN …`.
    #[default]
    Text,
    /// One JSON object a line, with `time` (Unix seconds), `level`, `target` and
    /// `message`, and the event's fields.
    Json,
}

/// The global flags that shape what wasmproc says on stderr.
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct Logging {
    /// More of wasmproc's own logs on stderr: -v debug, -vv trace (on top of RUST_LOG,
    /// which sets the filter as usual, e.g. RUST_LOG=wasmproc=debug; default: warnings).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    /// Errors only: no warnings, notices or compile message from wasmproc (overrides
    /// RUST_LOG). Program output is not affected.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// How wasmproc's own lines on stderr are written: text, or json (one JSON object a
    /// line: logs, messages, guest log lines, the --stats summary). A WASI program's own
    /// stderr is passed through as it is.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t, global = true)]
    log_format: LogFormat,
}

/// What the global flags chose, for every writer of the process; see the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Style {
    pub(crate) quiet: bool,
    pub(crate) json: bool,
}

/// Set once by [`Logging::install`], before any thread that writes starts.
static STYLE: OnceLock<Style> = OnceLock::new();

/// The process's [`Style`]; the default (text, not quiet) until installed.
pub(crate) fn style() -> Style {
    STYLE.get().copied().unwrap_or_default()
}

impl Style {
    /// The line (with its newline) of a message at `level` from `target`, or `None` if
    /// `-q` hides it.
    fn message(self, level: Say, target: &str, text: &str, fields: Map<String, Value>) -> Option<String> {
        if self.quiet && matches!(level, Say::Warning | Say::Notice) {
            return None;
        }
        Some(if self.json {
            let mut object = Map::new();
            object.insert("time".to_owned(), json!(unix_time()));
            object.insert("level".to_owned(), json!(level.level()));
            object.insert("target".to_owned(), json!(target));
            object.insert("message".to_owned(), json!(text));
            object.extend(fields);
            format!("{}\n", json_line(&Value::Object(object)))
        } else {
            match level {
                Say::Error => format!("error: {text}\n"),
                Say::Warning | Say::Notice | Say::Report => format!("wasmproc: {text}\n"),
            }
        })
    }
}

/// `value` as one line of JSON that a terminal shows as it is: JSON escapes the C0
/// controls already, and this the rest of what [`Escaped`] escapes (DEL, the C1 controls
/// such as the one-byte CSI, and the bidirectional overrides), as `\u` escapes that
/// decode to the same text.
pub(crate) fn json_line(value: &Value) -> String {
    let line = value.to_string();
    if !line.contains(Escaped::needs_escape) {
        return line;
    }
    let mut safe = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if Escaped::needs_escape(c) {
            // Each is in the Basic Multilingual Plane: four hex digits.
            safe.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            safe.push(c);
        }
    }
    safe
}

/// Seconds since the Unix epoch, to the microsecond, for the JSON lines' `time`.
fn unix_time() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| (d.as_micros() as f64) / 1e6)
}

impl Logging {
    /// Fixes the process's [`Style`] and installs the `tracing` subscriber of the binary:
    /// the library's events on stderr, at `warn` and above unless `RUST_LOG` says
    /// otherwise; `-v`/`-vv` add debug/trace for wasmproc's own targets; `-q` keeps
    /// errors only. A failed write is ignored (as [`say_now`] does), never a panic.
    pub(crate) fn install(self) {
        let style = Style { quiet: self.quiet, json: self.log_format == LogFormat::Json };
        // Only `main` installs, once.
        let _ = STYLE.set(style);
        let filter = if self.quiet {
            EnvFilter::default().add_directive(LevelFilter::ERROR.into())
        } else {
            let mut filter = EnvFilter::builder().with_default_directive(LevelFilter::WARN.into()).from_env_lossy();
            let ours = match self.verbose {
                0 => None,
                1 => Some("wasmproc=debug"),
                _ => Some("wasmproc=trace"),
            };
            if let Some(Ok(directive)) = ours.map(str::parse) {
                filter = filter.add_directive(directive);
            }
            filter
        };
        let builder =
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).log_internal_errors(false);
        // Each fails only if a subscriber is installed already, which nothing else does.
        let _ = if style.json {
            tracing::subscriber::set_global_default(builder.event_format(JsonLines).finish())
        } else {
            tracing::subscriber::set_global_default(builder.without_time().with_target(false).with_ansi(false).finish())
        };
    }
}

/// The `--log-format json` form of a `tracing` event: one object a line, the event's
/// fields beside `time`, `level`, `target`, `message` and the names of its spans.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut object = Map::new();
        object.insert("time".to_owned(), json!(unix_time()));
        object.insert("level".to_owned(), json!(meta.level().as_str().to_ascii_lowercase()));
        object.insert("target".to_owned(), json!(meta.target()));
        event.record(&mut JsonFields(&mut object));
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<&str> = scope.from_root().map(|span| span.name()).collect();
            object.insert("spans".to_owned(), json!(spans));
        }
        writeln!(writer, "{}", json_line(&Value::Object(object)))
    }
}

/// Collects an event's fields into a JSON object.
struct JsonFields<'a>(&'a mut Map<String, Value>);

impl tracing::field::Visit for JsonFields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), json!(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), json!(value));
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().to_owned(), json!(value));
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().to_owned(), json!(value));
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().to_owned(), json!(value));
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().to_owned(), json!(value));
    }
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

    /// A line written while the live line is shown starts on a line
    /// of its own, the live line erased first.
    #[test]
    fn the_live_line_is_erased_before_the_next_line() {
        let written = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let stream = Stream::start("test", Closing { ok: usize::MAX, written: written.clone() });
        stream.send(Message::Live(b"\r\x1b[K3 alive".to_vec()));
        stream.guest(b"[pid 1] stdout: hi\n".to_vec());
        stream.send(Message::Bytes(b"wasmproc: note\n".to_vec()));
        stream.send(Message::Live(b"\r\x1b[K2 alive".to_vec()));
        stream.send(Message::Live(ERASE.to_vec()));
        stream.send(Message::Bytes(b"error: done\n".to_vec()));
        assert!(stream.flush(None));
        assert_eq!(
            String::from_utf8_lossy(&written.lock()),
            "\r\x1b[K3 alive\r\x1b[K[pid 1] stdout: hi\nwasmproc: note\n\r\x1b[K2 alive\r\x1b[Kerror: done\n"
        );
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
