//! Workflows' logs: every line each process of a workflow logs (its `host.log` calls and
//! its stdout and stderr), kept per workflow in the data directory until the workflow is
//! forgotten, and read or followed through `GET /v1/workflows/{id}/logs`.
//!
//! # How lines get there
//!
//! The runtime's log sink runs on the worker thread of the process that logged. It finds
//! the line's workflow by the process's chain of parents up to its root (cached per
//! process), and hands the line to the logs' writer thread through a bounded queue: a
//! line that finds the queue full is counted, not waited for, and the count is written
//! as a marker line once there is room. Lines a durable process logs again while its
//! history is replayed are not kept again. The writer appends each line to the
//! workflow's file as one JSON object (`{"seq", "ms", "pid", "source", "message"}`), then
//! hands it to those following the workflow.
//!
//! # Bounds
//!
//! - **On disk**: a workflow's log is two files, `DATA/logs/TENANT/ID.log` and the one
//!   before it, `ID.log.1`, of at most half the cap each (`--max-log-bytes`). When the
//!   current one is full it becomes the older one, and the older one's lines are
//!   dropped, counted in `ID.dropped`: a read begins with a marker saying how many.
//! - **A line**: at most [`MAX_MESSAGE`] bytes of message; the rest is cut, saying so.
//! - **A follower**: new lines reach followers through a channel of [`FOLLOW_LINES`]
//!   lines per workflow; a follower that reads more slowly than the workflow logs misses
//!   lines, and is sent a marker saying how many, instead of the server buffering them.
//!
//! A line still in the queue when the server is killed is lost: logs are not part of the
//! journal.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use wasmproc_types::Pid;

use super::{Refusal, Service, State, now_ms};
use crate::scheduler::Handle;
use crate::wasm::{LogRecord, LogSink};

/// The most bytes of one line's message that are kept; the rest is cut, saying so.
pub(super) const MAX_MESSAGE: usize = 16 * 1024;

/// Lines a workflow's followers may be behind before they miss some. With lines of at
/// most [`MAX_MESSAGE`], about 4 MiB a followed workflow at most; picked to ride out a
/// burst of logging, not tuned.
pub(super) const FOLLOW_LINES: usize = 256;

/// Lines waiting for the writer thread. Picked to ride out bursts, not tuned.
const QUEUE_LINES: usize = 16 * 1024;

/// Lines of a root process not yet known as a workflow's (its start is being recorded),
/// held for when it is; past this they are dropped.
const HELD_LINES: usize = 4 * 1024;

type Workflow = (String, String);

/// A line for followers: its sequence number and its JSON text.
type Followed = (u64, Arc<str>);

/// The writer thread's work.
enum Work {
    Line {
        root: Pid,
        pid: Pid,
        source: String,
        message: String,
        ms: u64,
    },
    /// `root` is now known as a workflow's root.
    Known(Pid),
    /// The workflow has ended: no more lines come, and its followers are done.
    Ended(Workflow),
    /// The workflow is forgotten: its files go.
    Forget(Workflow),
}

/// The roots of processes that logged and are no roots themselves, and each root's
/// such descendants, so that a workflow's end forgets its own without looking at others'.
#[derive(Default)]
struct Ancestors {
    root_of: HashMap<Pid, Pid>,
    under: HashMap<Pid, Vec<Pid>>,
}

impl Ancestors {
    fn root_of(&self, pid: Pid) -> Option<Pid> {
        self.root_of.get(&pid).copied()
    }

    fn insert(&mut self, pid: Pid, root: Pid) {
        if let Some(before) = self.root_of.insert(pid, root) {
            if before == root {
                return;
            }
            if let Some(theirs) = self.under.get_mut(&before) {
                theirs.retain(|p| *p != pid);
            }
        }
        self.under.entry(root).or_default().push(pid);
    }

    /// Forgets `root`'s descendants.
    fn forget(&mut self, root: Pid) {
        for pid in self.under.remove(&root).unwrap_or_default() {
            self.root_of.remove(&pid);
        }
    }
}

/// The service's logs: see the module's docs.
pub(super) struct Logs {
    dir: PathBuf,
    max_bytes: u64,
    handle: OnceLock<Handle>,
    /// Workflows by their root process.
    roots: RwLock<HashMap<Pid, Workflow>>,
    /// The root of each process that logged and is not a root itself.
    ancestors: Mutex<Ancestors>,
    queue: SyncSender<Work>,
    queue_from: Mutex<Option<Receiver<Work>>>,
    /// Lines the sink found no room for, not yet reported.
    lost: AtomicU64,
    /// Lines the writer holds for roots not known yet. Raised with `roots` read-locked
    /// and read with it write-locked, so that a root made known either is seen by the
    /// writer before it holds a line of it, or finds the line held and says so.
    holding: AtomicUsize,
    followers: Mutex<HashMap<Workflow, broadcast::Sender<Followed>>>,
    /// Raised when the server stops: every follower's stream ends.
    closing: tokio::sync::watch::Sender<bool>,
}

impl Logs {
    pub(super) fn new(dir: PathBuf, max_bytes: u64) -> Logs {
        let (queue, queue_from) = std::sync::mpsc::sync_channel(QUEUE_LINES);
        Logs {
            dir,
            max_bytes: max_bytes.max(2),
            handle: OnceLock::new(),
            roots: RwLock::default(),
            ancestors: Mutex::default(),
            queue,
            queue_from: Mutex::new(Some(queue_from)),
            lost: AtomicU64::new(0),
            holding: AtomicUsize::new(0),
            followers: Mutex::default(),
            closing: tokio::sync::watch::channel(false).0,
        }
    }

    /// The runtime's log sink: every line to the service's own log, as by default, and a
    /// workflow's lines to its log too.
    pub(super) fn sink(self: &Arc<Self>) -> impl Fn(&LogRecord<'_>) + Send + Sync + 'static {
        let logs = Arc::downgrade(self);
        let host: LogSink = crate::wasm::tracing_sink();
        move |record: &LogRecord<'_>| {
            host(record);
            if record.replayed {
                return;
            }
            let Some(logs) = logs.upgrade() else { return };
            let Some(root) = logs.root_of(record.pid) else { return };
            let mut message = record.message.to_owned();
            cut(&mut message);
            let line = Work::Line { root, pid: record.pid, source: record.source.to_string(), message, ms: now_ms() };
            if let Err(TrySendError::Full(_)) = logs.queue.try_send(line) {
                logs.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Gives the logs the scheduler's handle, to find processes' parents.
    pub(super) fn attach(&self, handle: Handle) {
        let _ = self.handle.set(handle);
    }

    /// The root of `pid`'s tree: itself if the embedder spawned it.
    fn root_of(&self, pid: Pid) -> Option<Pid> {
        if self.roots.read().contains_key(&pid) {
            return Some(pid);
        }
        if let Some(root) = self.ancestors.lock().root_of(pid) {
            return Some(root);
        }
        let handle = self.handle.get()?;
        let mut at = pid;
        let mut chain = Vec::new();
        // A process's parents are alive while it runs unless they ended first; the walk
        // stops at the first one known, and a tree deeper than this is no workflow's.
        for _ in 0..1024 {
            let parent = handle.parent_of(at)?;
            if parent == Pid::HOST {
                break;
            }
            chain.push(at);
            if self.roots.read().contains_key(&parent) {
                at = parent;
                break;
            }
            if let Some(root) = self.ancestors.lock().root_of(parent) {
                at = root;
                break;
            }
            at = parent;
        }
        let mut ancestors = self.ancestors.lock();
        for pid in chain {
            ancestors.insert(pid, at);
        }
        Some(at)
    }

    /// Knows `root` as the root process of `tenant`'s workflow `id`.
    pub(super) fn track(&self, root: Pid, tenant: &str, id: &str) {
        let holding = {
            let mut roots = self.roots.write();
            roots.insert(root, (tenant.to_owned(), id.to_owned()));
            self.holding.load(Ordering::Relaxed)
        };
        // Blocking: the lines held for it wait for this. With none held, the writer finds
        // the root in `roots` for every line it takes from now on.
        if holding > 0 {
            let _ = self.queue.send(Work::Known(root));
        }
    }

    /// `tenant`'s workflow `id`, whose root was `root` if known, has ended.
    pub(super) fn ended(&self, root: Option<Pid>, tenant: &str, id: &str) {
        let workflow = (tenant.to_owned(), id.to_owned());
        let root = match root {
            Some(root) => self.roots.read().get(&root).is_some_and(|w| *w == workflow).then_some(root),
            None => self.roots.read().iter().find(|(_, w)| **w == workflow).map(|(root, _)| *root),
        };
        if let Some(root) = root {
            self.roots.write().remove(&root);
            self.ancestors.lock().forget(root);
        }
        // Blocking: the end must follow the workflow's last lines, and must not be lost.
        let _ = self.queue.send(Work::Ended(workflow));
    }

    /// `tenant`'s workflow `id` is forgotten: its log goes.
    pub(super) fn forget(&self, tenant: &str, id: &str) {
        let _ = self.queue.send(Work::Forget((tenant.to_owned(), id.to_owned())));
    }

    fn files(&self, (tenant, id): &Workflow) -> Files {
        let dir = self.dir.join(tenant);
        Files {
            current: dir.join(format!("{id}.log")),
            older: dir.join(format!("{id}.log.1")),
            dropped: dir.join(format!("{id}.dropped")),
            dir,
        }
    }

    /// The lines kept of `tenant`'s workflow `id`, oldest first, as JSON text, a marker
    /// first if older ones were dropped; and the sequence number of the last.
    pub(super) fn read(&self, tenant: &str, id: &str) -> std::io::Result<(Vec<String>, Option<u64>)> {
        let files = self.files(&(tenant.to_owned(), id.to_owned()));
        let mut lines = Vec::new();
        let dropped = read_count(&files.dropped);
        if dropped > 0 {
            lines.push(self.marker(dropped).to_string());
        }
        let mut last = None;
        for path in [&files.older, &files.current] {
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            // A last line without its newline is being written: it reaches followers
            // once it is whole.
            for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
                let line = line.trim_end();
                // A line torn by a crash mid-write is no JSON: left out.
                let Ok(value) = serde_json::from_str::<Value>(line) else { continue };
                let seq = value["seq"].as_u64();
                if seq.is_some_and(|seq| last.is_some_and(|last| seq <= last)) {
                    continue;
                }
                last = seq.or(last);
                lines.push(line.to_owned());
            }
        }
        Ok((lines, last))
    }

    fn marker(&self, dropped: u64) -> Value {
        json!({
            "dropped": dropped,
            "message": format!(
                "{dropped} older lines were dropped: a workflow keeps at most {} bytes of log (the server's \
                 `--max-log-bytes`)",
                self.max_bytes
            ),
        })
    }

    /// New lines of `tenant`'s workflow `id` from now on, until it ends; `None` if it
    /// is not running (`running` says whether it is, asked after the subscription so an
    /// end between the two is not missed).
    pub(super) fn follow(
        &self,
        tenant: &str,
        id: &str,
        running: impl FnOnce() -> bool,
    ) -> Option<broadcast::Receiver<Followed>> {
        let workflow = (tenant.to_owned(), id.to_owned());
        let receiver = self
            .followers
            .lock()
            .entry(workflow.clone())
            .or_insert_with(|| broadcast::channel(FOLLOW_LINES).0)
            .subscribe();
        if running() {
            return Some(receiver);
        }
        drop(receiver);
        let mut followers = self.followers.lock();
        if followers.get(&workflow).is_some_and(|sender| sender.receiver_count() == 0) {
            followers.remove(&workflow);
        }
        None
    }
}

/// The files of one workflow's log.
struct Files {
    dir: PathBuf,
    current: PathBuf,
    older: PathBuf,
    dropped: PathBuf,
}

/// A workflow's log as the writer keeps it open.
struct Open {
    file: std::fs::File,
    /// Bytes in the current file.
    bytes: u64,
    /// Lines in the older file (dropped when it goes).
    older_lines: u64,
    /// Lines in the current file.
    lines: u64,
    next_seq: u64,
}

fn read_count(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|text| text.trim().parse().ok()).unwrap_or(0)
}

/// Cuts `message` to [`MAX_MESSAGE`] bytes (at a character boundary), saying how much went.
fn cut(message: &mut String) {
    if message.len() <= MAX_MESSAGE {
        return;
    }
    let mut at = MAX_MESSAGE;
    while !message.is_char_boundary(at) {
        at -= 1;
    }
    let cut = message.len() - at;
    message.truncate(at);
    message.push_str(&format!("… ({cut} more bytes cut)"));
}

/// Starts the writer thread. Called once the workflows are reattached.
pub(super) fn start(logs: &Arc<Logs>) -> anyhow::Result<()> {
    let work = logs.queue_from.lock().take().expect("the logs' writer starts once");
    let logs = Arc::downgrade(logs);
    std::thread::Builder::new()
        .name("wasmproc-serve-logs".to_owned())
        .spawn(move || {
            let mut writer = Writer { open: HashMap::new(), held: HashMap::new(), held_lines: 0 };
            while let Ok(first) = work.recv() {
                let Some(logs) = logs.upgrade() else { return };
                for item in std::iter::once(first).chain(work.try_iter()) {
                    writer.take(&logs, item);
                }
            }
        })
        .map_err(|e| anyhow::anyhow!("cannot start the service's logs' writer: {e}"))?;
    Ok(())
}

/// The writer thread's state.
struct Writer {
    open: HashMap<Workflow, Open>,
    /// Lines of roots not known yet, by root.
    held: HashMap<Pid, Vec<Work>>,
    held_lines: usize,
}

impl Writer {
    fn take(&mut self, logs: &Logs, work: Work) {
        match work {
            Work::Line { root, .. } => {
                let roots = logs.roots.read();
                let workflow = roots.get(&root).cloned();
                // A root still alive is a workflow whose start is being recorded; the
                // lines of one that has ended are late lines of a workflow ended.
                let alive = || logs.handle.get().is_some_and(|handle| handle.parent_of(root).is_some());
                match workflow {
                    Some(workflow) => {
                        drop(roots);
                        // Known since its first lines were held, and `Known` not yet
                        // taken: the held lines go first, so that the log keeps the
                        // order the lines were logged in.
                        self.release(logs, root);
                        self.write(logs, &workflow, work);
                    }
                    None if self.held_lines < HELD_LINES && alive() => {
                        // Counted before `roots` is unlocked (see `Logs::holding`).
                        logs.holding.fetch_add(1, Ordering::Relaxed);
                        drop(roots);
                        self.held_lines += 1;
                        self.held.entry(root).or_default().push(work);
                    }
                    None => tracing::debug!("a line of process {root}, of no known workflow, is not kept"),
                }
            }
            Work::Known(root) => self.release(logs, root),
            Work::Ended(workflow) => {
                self.open.remove(&workflow);
                logs.followers.lock().remove(&workflow);
            }
            Work::Forget(workflow) => {
                self.open.remove(&workflow);
                logs.followers.lock().remove(&workflow);
                let files = logs.files(&workflow);
                for path in [&files.current, &files.older, &files.dropped] {
                    if let Err(error) = std::fs::remove_file(path)
                        && error.kind() != std::io::ErrorKind::NotFound
                    {
                        tracing::warn!("cannot remove `{}`: {error}", path.display());
                    }
                }
            }
        }
    }

    /// Takes the lines held for `root`, in the order they came.
    fn release(&mut self, logs: &Logs, root: Pid) {
        if let Some(lines) = self.held.remove(&root) {
            self.held_lines -= lines.len();
            logs.holding.fetch_sub(lines.len(), Ordering::Relaxed);
            for line in lines {
                self.take(logs, line);
            }
        }
    }

    fn write(&mut self, logs: &Logs, workflow: &Workflow, line: Work) {
        let Work::Line { pid, source, message, ms, .. } = line else { return };
        let lost = logs.lost.swap(0, Ordering::Relaxed);
        if lost > 0 {
            tracing::warn!("{lost} log lines of workflows were not kept: the logs' writer fell behind");
        }
        if let Err(error) = self.append(logs, workflow, |seq| {
            let mut lines = Vec::new();
            if lost > 0 {
                let text =
                    format!("{lost} lines of this server's workflows were lost here: the log writer fell behind");
                lines.push(json!({"seq": seq, "ms": ms, "lost": lost, "message": text}));
            }
            let seq = seq + lines.len() as u64;
            lines.push(json!({"seq": seq, "ms": ms, "pid": pid.as_u64(), "source": source, "message": message}));
            lines
        }) {
            tracing::warn!("cannot keep a line of workflow `{}`'s log: {error}", workflow.1);
        }
    }

    /// Appends the lines `make` makes from the next sequence number, rotating first if
    /// they would overfill the current file, and hands them to the followers.
    fn append(
        &mut self,
        logs: &Logs,
        workflow: &Workflow,
        make: impl FnOnce(u64) -> Vec<Value>,
    ) -> std::io::Result<()> {
        let files = logs.files(workflow);
        let open = match self.open.entry(workflow.clone()) {
            std::collections::hash_map::Entry::Occupied(open) => open.into_mut(),
            std::collections::hash_map::Entry::Vacant(vacant) => vacant.insert(open_log(&files)?),
        };
        let lines = make(open.next_seq);
        let mut text = String::new();
        for line in &lines {
            text.push_str(&line.to_string());
            text.push('\n');
        }
        let half = logs.max_bytes / 2;
        if open.bytes > 0 && open.bytes + text.len() as u64 > half {
            // The older file's lines go; the current becomes the older.
            let dropped = read_count(&files.dropped) + open.older_lines;
            std::fs::write(&files.dropped, format!("{dropped}\n"))?;
            std::fs::rename(&files.current, &files.older)?;
            open.file = append_to(&files.current)?;
            open.older_lines = open.lines;
            open.lines = 0;
            open.bytes = 0;
        }
        open.file.write_all(text.as_bytes())?;
        open.bytes += text.len() as u64;
        open.lines += lines.len() as u64;
        open.next_seq += lines.len() as u64;
        if let Some(followers) = logs.followers.lock().get(workflow) {
            for line in &lines {
                let seq = line["seq"].as_u64().unwrap_or_default();
                let _ = followers.send((seq, line.to_string().into()));
            }
        }
        Ok(())
    }
}

fn append_to(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// Opens a workflow's log for appending, reading where it left off.
fn open_log(files: &Files) -> std::io::Result<Open> {
    super::private_dir(&files.dir).map_err(std::io::Error::other)?;
    let count = |path: &Path| -> (u64, u64, Option<u64>) {
        let Ok(text) = std::fs::read_to_string(path) else { return (0, 0, None) };
        let whole: Vec<&str> = text.split_inclusive('\n').filter(|l| l.ends_with('\n')).collect();
        let last = whole.last().and_then(|l| serde_json::from_str::<Value>(l).ok()).and_then(|v| v["seq"].as_u64());
        (text.len() as u64, whole.len() as u64, last)
    };
    let (_, older_lines, older_last) = count(&files.older);
    let (bytes, lines, last) = count(&files.current);
    let next_seq = last.or(older_last).map_or(0, |last| last + 1);
    let mut file = append_to(&files.current)?;
    if bytes > 0 && !std::fs::read(&files.current)?.ends_with(b"\n") {
        // A line torn by a crash mid-write: the next starts on a line of its own.
        file.write_all(b"\n")?;
    }
    Ok(Open { file, bytes, older_lines, lines, next_seq })
}

impl Service {
    /// `tenant`'s workflow `id`'s log as newline-delimited JSON: the lines kept, a marker
    /// first if older ones were dropped; with `follow`, then each new line as it is
    /// written, until the workflow ends (or the server stops its streams,
    /// [`Service::end_streams`]).
    ///
    /// # Errors
    ///
    /// No such workflow (404), or a log that cannot be read.
    pub async fn log_body(&self, tenant: &str, id: &str, follow: bool) -> Result<axum::body::Body, Refusal> {
        self.workflow(tenant, id)?;
        let logs = self.inner.logs.clone();
        let receiver = if follow {
            let running = || self.workflow(tenant, id).is_ok_and(|w| w.state == State::Running);
            logs.follow(tenant, id, running)
        } else {
            None
        };
        let (tenant2, id2, logs2) = (tenant.to_owned(), id.to_owned(), logs.clone());
        let (lines, last) = tokio::task::spawn_blocking(move || logs2.read(&tenant2, &id2))
            .await
            .map_err(|e| Refusal::internal(&anyhow::anyhow!("a request's work failed: {e}")))?
            .map_err(|e| Refusal::internal(&anyhow::anyhow!("cannot read workflow `{id}`'s log: {e}")))?;
        let mut head = String::new();
        for line in lines {
            head.push_str(&line);
            head.push('\n');
        }
        let Some(receiver) = receiver else { return Ok(axum::body::Body::from(head)) };
        let closing = logs.closing.subscribe();
        let start = Following { head: Some(head), receiver, last, closing };
        let stream = futures_util::stream::unfold(start, |mut state| async move {
            let chunk = state.next().await?;
            Some((Ok::<_, std::convert::Infallible>(chunk), state))
        });
        Ok(axum::body::Body::from_stream(stream))
    }

    /// Ends every log stream that follows a workflow: a server that stops does so first,
    /// so that its followers do not hold its stop up.
    pub fn end_streams(&self) {
        self.inner.logs.closing.send_replace(true);
    }
}

/// A follower's stream: what it has been sent, and where new lines come from.
struct Following {
    head: Option<String>,
    receiver: broadcast::Receiver<Followed>,
    /// The sequence number of the last line sent.
    last: Option<u64>,
    closing: tokio::sync::watch::Receiver<bool>,
}

impl Following {
    /// The next chunk to send; `None` once the workflow has ended or the server stops.
    async fn next(&mut self) -> Option<String> {
        if let Some(head) = self.head.take()
            && !head.is_empty()
        {
            return Some(head);
        }
        loop {
            let received = tokio::select! {
                received = self.receiver.recv() => received,
                _ = self.closing.wait_for(|closing| *closing) => return None,
            };
            match received {
                Ok((seq, line)) => {
                    // Read from the file already, between the subscription and the read.
                    if self.last.is_some_and(|last| seq <= last) {
                        continue;
                    }
                    self.last = Some(seq);
                    return Some(format!("{line}\n"));
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    let text = format!(
                        "{missed} lines were not sent: this client read more slowly than the workflow logged (the \
                         server keeps {FOLLOW_LINES} lines for its followers); read the log again for them"
                    );
                    return Some(format!("{}\n", json!({"missed": missed, "message": text})));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Idle;
    use crate::{Process, Scheduler};

    fn line(root: Pid, message: &str) -> Work {
        Work::Line { root, pid: root, source: "info".into(), message: message.into(), ms: 1 }
    }

    /// A workflow's end forgets its descendants' roots and no other's, whichever root a
    /// descendant was first taken for.
    #[test]
    fn an_end_forgets_its_own_descendants_only() {
        let (a, b) = (Pid::from_u64(1), Pid::from_u64(2));
        let mut ancestors = Ancestors::default();
        ancestors.insert(Pid::from_u64(10), a);
        ancestors.insert(Pid::from_u64(11), a);
        ancestors.insert(Pid::from_u64(20), b);
        // Taken for `a` while its parent was unknown, then found to be `b`'s.
        ancestors.insert(Pid::from_u64(11), b);
        ancestors.insert(Pid::from_u64(11), b);
        ancestors.forget(a);
        assert_eq!(ancestors.root_of(Pid::from_u64(10)), None);
        assert_eq!(ancestors.root_of(Pid::from_u64(11)), Some(b));
        assert_eq!(ancestors.root_of(Pid::from_u64(20)), Some(b));
        ancestors.forget(b);
        assert!(ancestors.root_of.is_empty() && ancestors.under.is_empty());
    }

    /// A line of a root not known yet is held, and the root made known says so, so the
    /// line is written; a root made known with nothing held costs the writer nothing.
    #[test]
    fn a_line_held_for_its_root_is_written_once_the_root_is_known() {
        let dir = std::env::temp_dir().join(format!("wasmproc-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let logs = Logs::new(dir.clone(), 1 << 20);
        let work = logs.queue_from.lock().take().unwrap();
        let scheduler = Scheduler::builder().workers(1).build().unwrap();
        logs.attach(scheduler.handle().clone());
        let early = scheduler.handle().spawn(Box::new(Idle) as Box<dyn Process>, "main").unwrap();
        let mut writer = Writer { open: HashMap::new(), held: HashMap::new(), held_lines: 0 };

        writer.take(&logs, line(early.pid(), "before its start was recorded"));
        assert_eq!(logs.holding.load(Ordering::Relaxed), 1);
        logs.track(early.pid(), "acme", "early");
        let known = work.try_recv().expect("the writer is told of a root it holds lines for");
        assert!(matches!(known, Work::Known(root) if root == early.pid()));
        writer.take(&logs, known);
        assert_eq!(logs.holding.load(Ordering::Relaxed), 0);
        let (lines, _) = logs.read("acme", "early").unwrap();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("before its start was recorded"), "{lines:?}");

        let later = scheduler.handle().spawn(Box::new(Idle) as Box<dyn Process>, "main").unwrap();
        logs.track(later.pid(), "acme", "later");
        assert!(work.try_recv().is_err(), "nothing held, nothing to tell");
        writer.take(&logs, line(later.pid(), "after"));
        let (lines, _) = logs.read("acme", "later").unwrap();
        assert!(lines.len() == 1 && lines[0].contains("after"), "{lines:?}");

        logs.ended(Some(later.pid()), "acme", "later");
        assert!(!logs.roots.read().contains_key(&later.pid()), "an ended root is forgotten");
        drop(scheduler);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
