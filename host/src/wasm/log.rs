//! Where a guest's words go: its `host.log` calls and its stdout and stderr, each line
//! tagged with the pid of the process that wrote it.
//!
//! Output streams are line-buffered per process and stream: a line reaches the sink when
//! its newline arrives, when it grows past [`MAX_LINE`], or when the process ends with a
//! partial line pending. So one line the guest prints is one log record, whatever
//! chunks WASI delivered it in.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

pub use wasmproc_types::Level;

use crate::scheduler::process::Pid;

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

/// `[pid 7] stdout: hello`, the format of the default sink; `[pid 7] stdout (replayed):
/// hello` for a replayed line.
impl fmt::Display for LogRecord<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replayed = if self.replayed { " (replayed)" } else { "" };
        write!(f, "[pid {}] {}{replayed}: {}", self.pid, self.source, self.message)
    }
}

/// Receives every [`LogRecord`] of every process of a runtime. Called on the worker
/// thread running the guest, in the middle of its step: it must not block for long.
pub type LogSink = Arc<dyn Fn(&LogRecord<'_>) + Send + Sync>;

/// The default sink: a `tracing` event per record, with target `wasmproc::guest` and the
/// pid and source as fields (a replayed line's source says so: `info (replayed)`); a
/// `host.log` call at its own level, a line of stdout at `info` and one of stderr at
/// `warn`. The library never writes to the host's streams
/// itself: whether and where the lines appear is the subscriber's choice.
pub(crate) fn tracing_sink() -> LogSink {
    Arc::new(|record: &LogRecord<'_>| {
        let (pid, message) = (record.pid.as_u64(), record.message);
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
pub(crate) struct GuestOutput {
    buffer: Arc<Mutex<LineBuffer>>,
}

impl GuestOutput {
    pub(crate) fn new(pid: Pid, source: LogSource, sink: LogSink) -> Self {
        GuestOutput { buffer: Arc::new(Mutex::new(LineBuffer { pid, source, sink, pending: Vec::new() })) }
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

    #[test]
    fn a_line_without_end_is_cut_at_the_bound() {
        let (sink, lines) = capture();
        let mut buffer = LineBuffer { pid: Pid::from_u64(1), source: LogSource::Stderr, sink, pending: Vec::new() };
        buffer.write(&vec![b'x'; MAX_LINE * 2 + 1]);
        assert_eq!(lines.lock().len(), 2);
        assert_eq!(buffer.pending.len(), 1);
    }
}
