//! Where a guest's words go: its `host.log` calls and its stdout and stderr, each line
//! tagged with the pid of the process that wrote it.
//!
//! Output streams are line-buffered per process and stream: a line reaches the sink when
//! its newline arrives, when it grows past [`MAX_LINE`], or when the process ends with a
//! partial line pending. So one line the guest prints is one log record, whatever
//! chunks WASI delivered it in.
//!
//! A record's message is the guest's, as it wrote it: it may hold newlines, carriage
//! returns, terminal escapes or bidirectional overrides, with which a line on a terminal
//! can pass for another (a host `error:`, a `[pid 1]` line) or repaint what is there.
//! Whatever shows a message to a person shows it through [`Escaped`], which writes each
//! such character as an escape: [`LogRecord`]'s `Display` and the default sink do.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

pub use wasmproc_types::Level;

use wasmproc_types::Pid;

/// Bytes a guest may write without a newline before they are logged as a line anyway, so
/// a process that never ends a line cannot make the host buffer without bound. Picked to
/// fit any sensible log line; not a tuning knob.
pub(crate) const MAX_LINE: usize = 16 * 1024;

/// Where a [`LogRecord`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogSource {
    /// A `host.log` call at this level.
    Log(Level),
    /// A line the guest wrote to WASI stdout.
    Stdout,
    /// A line the guest wrote to WASI stderr (a Rust guest's panic message lands here).
    Stderr,
}

impl fmt::Display for LogSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogSource::Log(level) => f.write_str(level.as_str()),
            LogSource::Stdout => f.write_str("stdout"),
            LogSource::Stderr => f.write_str("stderr"),
        }
    }
}

/// One line a process logged or printed.
#[derive(Debug, Clone, Copy)]
pub struct LogRecord<'a> {
    /// The process that wrote it.
    pub pid: Pid,
    /// How it was written.
    pub source: LogSource,
    /// The line, without its newline; invalid UTF-8 replaced.
    pub message: &'a str,
    /// Written while the process's recorded history was replayed, when a durable process
    /// resumed: the line was logged once already, when that step first ran.
    pub replayed: bool,
}

impl<'a> LogRecord<'a> {
    /// A line `pid` wrote now, marked [`LogRecord::replayed`] if this thread is replaying
    /// its history.
    pub(crate) fn now(pid: Pid, source: LogSource, message: &'a str) -> Self {
        LogRecord { pid, source, message, replayed: crate::scheduler::replaying_now() }
    }
}

/// `[pid 7] stdout: hello`, the message [`Escaped`]: one line, whatever it holds;
/// `[pid 7] stdout (replayed): hello` for a replayed line.
impl fmt::Display for LogRecord<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replayed = if self.replayed { " (replayed)" } else { "" };
        write!(f, "[pid {}] {}{replayed}: {}", self.pid, self.source, Escaped(self.message))
    }
}

/// Text from a guest, written so that it stays on its line and cannot act on a terminal:
/// each control character (C0, DEL, C1: newlines, carriage returns, the escapes of colours
/// and cursor moves) and each bidirectional formatting character as `\n`, `\r`, `\t` or
/// `\u{..}`; everything else as it is. Backslashes are not doubled: a literal `\n` the
/// guest wrote starts no line either.
pub struct Escaped<'a>(pub &'a str);

impl Escaped<'_> {
    /// Whether `c` is written as an escape.
    pub fn needs_escape(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut start = 0;
        for (at, c) in self.0.char_indices().filter(|&(_, c)| Escaped::needs_escape(c)) {
            f.write_str(&self.0[start..at])?;
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c => write!(f, "\\u{{{:x}}}", u32::from(c))?,
            }
            start = at + c.len_utf8();
        }
        f.write_str(&self.0[start..])
    }
}

/// Receives every [`LogRecord`] of every process of a runtime. Called on the worker
/// thread running the guest, in the middle of its step: it must not block for long.
pub type LogSink = Arc<dyn Fn(&LogRecord<'_>) + Send + Sync>;

/// The default sink: a `tracing` event per record, with target `wasmproc::guest` and the
/// pid and source as fields (a replayed line's source says so: `info (replayed)`), the
/// message [`Escaped`]; a `host.log` call at its own level, a line of stdout at `info`
/// and one of stderr at `warn`. The library never writes to the host's streams itself:
/// whether and where the lines appear is the subscriber's choice.
pub(crate) fn tracing_sink() -> LogSink {
    Arc::new(|record: &LogRecord<'_>| {
        let (pid, message) = (record.pid.as_u64(), Escaped(record.message));
        let source = if record.replayed { format!("{} (replayed)", record.source) } else { record.source.to_string() };
        let level = match record.source {
            LogSource::Log(level) => level,
            LogSource::Stdout => Level::Info,
            LogSource::Stderr => Level::Warn,
        };
        // `tracing`'s macros take the level as a constant.
        match level {
            Level::Trace => tracing::trace!(target: "wasmproc::guest", pid, source, "{message}"),
            Level::Debug => tracing::debug!(target: "wasmproc::guest", pid, source, "{message}"),
            Level::Info => tracing::info!(target: "wasmproc::guest", pid, source, "{message}"),
            Level::Warn => tracing::warn!(target: "wasmproc::guest", pid, source, "{message}"),
            Level::Error => tracing::error!(target: "wasmproc::guest", pid, source, "{message}"),
        }
    })
}

/// One process's stdout or stderr, as WASI sees it. Every stream the guest opens on it
/// shares one line buffer, so lines split across streams (or writes) come out whole.
/// Cheap to clone: the clones share the buffer.
#[derive(Clone)]
pub(crate) struct GuestOutput {
    buffer: Arc<Mutex<LineBuffer>>,
}

impl GuestOutput {
    pub(crate) fn new(pid: Pid, source: LogSource, sink: LogSink) -> Self {
        let buffer = LineBuffer { pid, source, sink, pending: Vec::new(), panic: Panic::default() };
        GuestOutput { buffer: Arc::new(Mutex::new(buffer)) }
    }

    /// The message of the panic the guest last reported on this stream (std's panic hook
    /// writes `thread '…' panicked at FILE:LINE:COL:` and the message to stderr), as
    /// `at FILE:LINE:COL: MESSAGE`; `None` if it reported none.
    pub(crate) fn panic(&self) -> Option<String> {
        self.buffer.lock().panic.message()
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(Writer { buffer: self.buffer.clone() })
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(Writer { buffer: self.buffer.clone() })
    }
}

struct LineBuffer {
    pid: Pid,
    source: LogSource,
    sink: LogSink,
    pending: Vec<u8>,
    /// The last panic reported on the stream (read on stderr only).
    panic: Panic,
}

impl LineBuffer {
    fn write(&mut self, mut bytes: &[u8]) {
        while let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
            self.pending.extend_from_slice(&bytes[..newline]);
            self.emit();
            bytes = &bytes[newline + 1..];
        }
        self.pending.extend_from_slice(bytes);
        while self.pending.len() >= MAX_LINE {
            let rest = self.pending.split_off(MAX_LINE);
            self.emit();
            self.pending = rest;
        }
    }

    fn emit(&mut self) {
        let line = String::from_utf8_lossy(&self.pending);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        if self.source == LogSource::Stderr {
            self.panic.read(line);
        }
        (self.sink)(&LogRecord::now(self.pid, self.source, line));
        self.pending.clear();
    }
}

impl Drop for LineBuffer {
    /// The process has ended (its store and every stream are gone): log what is left.
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            self.emit();
        }
    }
}

/// The most bytes of a panic's message kept: the result of the process carries it, and
/// a message longer than a few lines is cut (its whole text is on stderr all the same).
const MAX_PANIC: usize = 1024;

/// A panic report read from a guest's stderr, line by line, in the form of Rust's std
/// hook: `thread 'NAME' panicked at LOCATION:` (newer Rust writes `thread 'NAME' (ID)
/// panicked at`), then the message (one line or more), then
/// `note: run with `RUST_BACKTRACE=1` …` (the first panic only) or the end of the step,
/// which the panic aborts. Rust before 1.73 wrote `panicked at 'MESSAGE', LOCATION` on
/// one line; that is read too. Another language's runtime writes another form, and its
/// trap is reported as it is.
#[derive(Default)]
struct Panic {
    location: String,
    message: String,
    /// The lines after a `panicked at` line are its message.
    reading: bool,
}

impl Panic {
    fn read(&mut self, line: &str) {
        if let Some(at) =
            line.strip_prefix("thread '").and_then(|rest| rest.split_once(" panicked at ")).map(|(_, at)| at)
        {
            self.message.clear();
            self.location.clear();
            match at.strip_suffix(':') {
                Some(location) => {
                    push_bounded(&mut self.location, location);
                    self.reading = true;
                }
                None => {
                    // `'MESSAGE', LOCATION`
                    let (message, location) = at.rsplit_once("', ").unwrap_or((at, ""));
                    push_bounded(&mut self.message, message.strip_prefix('\'').unwrap_or(message));
                    push_bounded(&mut self.location, location);
                    self.reading = false;
                }
            }
            return;
        }
        if !self.reading {
            return;
        }
        if line.starts_with("note: run with `RUST_BACKTRACE") || line == "stack backtrace:" {
            self.reading = false;
            return;
        }
        if !self.message.is_empty() {
            push_bounded(&mut self.message, "\n");
        }
        push_bounded(&mut self.message, line);
    }

    fn message(&self) -> Option<String> {
        if self.location.is_empty() && self.message.is_empty() {
            return None;
        }
        Some(match (self.location.is_empty(), self.message.is_empty()) {
            (false, false) => format!("at {}: {}", self.location, self.message),
            (true, _) => self.message.clone(),
            (false, true) => format!("at {}", self.location),
        })
    }
}

/// Appends `text` to `to`, which holds at most [`MAX_PANIC`] bytes: what does not fit is
/// cut at a character boundary and marked with `…`.
fn push_bounded(to: &mut String, text: &str) {
    if to.ends_with('…') && to.len() >= MAX_PANIC {
        return;
    }
    let room = MAX_PANIC.saturating_sub(to.len());
    if text.len() <= room {
        to.push_str(text);
        return;
    }
    let mut cut = room;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    to.push_str(&text[..cut]);
    to.push('…');
}

/// A stream onto a [`LineBuffer`]. Never blocks and never refuses: the buffer is bounded
/// by [`MAX_LINE`], and the sink takes whole lines.
struct Writer {
    buffer: Arc<Mutex<LineBuffer>>,
}

/// What WASI may write at once; anything positive works, since a write never waits.
const WRITE_PERMIT: usize = 64 * 1024;

impl OutputStream for Writer {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.buffer.lock().write(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Writer {
    async fn ready(&mut self) {}
}

impl AsyncWrite for Writer {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, bytes: &[u8]) -> Poll<std::io::Result<usize>> {
        self.buffer.lock().write(bytes);
        Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture() -> (LogSink, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        let sink: LogSink = Arc::new(move |r: &LogRecord<'_>| seen.lock().push(r.to_string()));
        (sink, lines)
    }

    #[test]
    fn a_replayed_line_says_so() {
        let pid = Pid::from_u64(7);
        let record = LogRecord { pid, source: LogSource::Log(Level::Info), message: "round 1", replayed: true };
        assert_eq!(record.to_string(), "[pid 7] info (replayed): round 1");
        let record = LogRecord { replayed: false, ..record };
        assert_eq!(record.to_string(), "[pid 7] info: round 1");
        assert!(!LogRecord::now(pid, LogSource::Stdout, "").replayed, "no replay on this thread");
    }

    #[test]
    fn lines_are_whole_whatever_the_chunks() {
        let (sink, lines) = capture();
        let out = GuestOutput::new(Pid::from_u64(7), LogSource::Stdout, sink);
        let mut a = Writer { buffer: out.buffer.clone() };
        let mut b = Writer { buffer: out.buffer.clone() };
        a.write(bytes::Bytes::from_static(b"hel")).unwrap();
        b.write(bytes::Bytes::from_static(b"lo\r\nwor")).unwrap();
        a.write(bytes::Bytes::from_static(b"ld\n\ntail")).unwrap();
        assert_eq!(*lines.lock(), ["[pid 7] stdout: hello", "[pid 7] stdout: world", "[pid 7] stdout: "]);
        drop((a, b, out));
        assert_eq!(lines.lock().last().map(String::as_str), Some("[pid 7] stdout: tail"));
    }

    /// The panic a Rust guest reports on stderr is kept for its
    /// process's result, in the form of today's std and of Rust before 1.73.
    #[test]
    fn a_panic_reported_on_stderr_is_kept() {
        let (sink, lines) = capture();
        let err = GuestOutput::new(Pid::from_u64(2), LogSource::Stderr, sink.clone());
        let mut w = Writer { buffer: err.buffer.clone() };
        assert_eq!(err.panic(), None);
        w.write(bytes::Bytes::from_static(b"thread '<unnamed>' panicked at src/lib.rs:57:16:\nindex out of bounds: "))
            .unwrap();
        w.write(bytes::Bytes::from_static(b"the len is 3 but the index is 5\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n")).unwrap();
        assert_eq!(
            err.panic().as_deref(),
            Some("at src/lib.rs:57:16: index out of bounds: the len is 3 but the index is 5")
        );
        assert_eq!(lines.lock().len(), 3, "the lines are logged as well");
        w.write(bytes::Bytes::from_static(b"thread 'main' panicked at 'two\nlines'\n")).unwrap();
        w.write(bytes::Bytes::from_static(b"thread 'main' panicked at 'old form', src/main.rs:2:5\n")).unwrap();
        assert_eq!(err.panic().as_deref(), Some("at src/main.rs:2:5: old form"));
        w.write(bytes::Bytes::from_static(b"thread '<unnamed>' (1) panicked at a.rs:1:1:\nfirst\nsecond\n")).unwrap();
        assert_eq!(err.panic().as_deref(), Some("at a.rs:1:1: first\nsecond"));
        let long = format!("thread 'main' panicked at a.rs:1:1:\n{}\n", "é".repeat(MAX_PANIC));
        w.write(bytes::Bytes::from(long)).unwrap();
        let kept = err.panic().unwrap();
        assert!(kept.ends_with('…') && kept.len() <= MAX_PANIC + 32, "{} bytes", kept.len());
        let out = GuestOutput::new(Pid::from_u64(2), LogSource::Stdout, sink);
        let mut w = Writer { buffer: out.buffer.clone() };
        w.write(bytes::Bytes::from_static(b"thread 'main' panicked at a.rs:1:1:\nnot on stdout\n")).unwrap();
        assert_eq!(out.panic(), None, "only stderr is read");
    }

    /// A guest's line cannot start another line, pass for a host line
    /// or act on a terminal.
    #[test]
    fn a_record_shows_the_guests_control_characters_escaped_on_one_line() {
        let forged = "ok\nerror: the host failed\r[pid 1] info: \u{1b}[31mred\u{7f}\u{9b}2J\u{202e}txt\tend\\n";
        let record =
            LogRecord { pid: Pid::from_u64(3), source: LogSource::Log(Level::Info), message: forged, replayed: false };
        assert_eq!(
            record.to_string(),
            "[pid 3] info: ok\\nerror: the host failed\\r[pid 1] info: \\u{1b}[31mred\\u{7f}\\u{9b}2J\\u{202e}txt\\tend\\n"
        );
        assert_eq!(Escaped("plain text, ünïcödé ✓").to_string(), "plain text, ünïcödé ✓");
    }

    #[test]
    fn a_line_without_end_is_cut_at_the_bound() {
        let (sink, lines) = capture();
        let mut buffer = LineBuffer {
            pid: Pid::from_u64(1),
            source: LogSource::Stderr,
            sink,
            pending: Vec::new(),
            panic: Panic::default(),
        };
        buffer.write(&vec![b'x'; MAX_LINE * 2 + 1]);
        assert_eq!(lines.lock().len(), 2);
        assert_eq!(buffer.pending.len(), 1);
    }
}
