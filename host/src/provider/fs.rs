//! `fs.*`: files in the host directories granted to processes, under the paths the
//! processes see them at.
//!
//! Nothing is reachable by default. Each [`Grant`] maps a host directory to a guest path
//! (`--dir HOST::GUEST`, `--dir-rw` for a writable one), and every command names a guest
//! path: absolute, without `..`, inside one grant (the longest guest path that contains
//! it wins). The host directory is opened once, at [`Files::new`], and every path is
//! resolved beneath that handle by `cap-primitives`, the sandboxing wasmtime's WASI
//! builds on: a symbolic link that leads out of the directory is refused however it is
//! reached, so the grant is the directory and nothing else.
//!
//! Commands, with JSON input:
//!
//! - `fs.read {"path"}`: the file's bytes, as a `bytes` payload (not JSON: files are
//!   bytes); past [`FilesSettings::max_read`] it fails `limit`.
//! - `fs.write {"path", "text" | "data": [bytes], "append": false}`: creates or
//!   replaces (or appends to) the file → `{"bytes": n}`. Needs a writable grant.
//! - `fs.list {"path"}` → `{"entries": [{"name", "kind", "size"}]}`, by name; `kind` is
//!   `file`, `dir`, `symlink` or `other`.
//! - `fs.stat {"path"}` → `{"kind", "size", "modified_ms"}`, not following a final link.
//! - `fs.mkdir {"path"}`, `fs.remove {"path"}` (a file or an empty directory): writable
//!   grants only → `{}`.
//!
//! Only regular files are read and written: a FIFO, a device or a socket in a grant is
//! refused, and without waiting for it (files are opened non-blocking, so a FIFO with no
//! writer, or a file another program holds a lease on, answers at once).
//!
//! File I/O blocks, so it runs on threads of the provider's, never on the worker that
//! ran the step: [`FILE_THREADS`] of them, taking requests in order, so that one slow
//! file (on a network file system, say) holds one thread and the others go on serving
//! every other process.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::UNIX_EPOCH;

use cap_primitives::fs::{DirOptions, FollowSymlinks, OpenOptions};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{ErrorCode, Failure, Provider, answer, input, unknown};
use crate::Payload;
use crate::handler::{Completer, Request};

const COMMANDS: [&str; 6] = ["read", "write", "list", "stat", "mkdir", "remove"];

/// The threads that carry out file commands. More than one, so a file that is slow to
/// answer stops only the commands that wait for it; few, since each blocks in the kernel
/// and local files answer fast.
pub const FILE_THREADS: usize = 4;

/// A host directory granted to processes.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where processes see it: an absolute path such as `/data`.
    pub guest: String,
    /// Whether processes may change what is in it.
    pub writable: bool,
}

/// Limits of the `fs` provider.
#[derive(Clone, Debug)]
pub struct FilesSettings {
    /// The largest file `fs.read` returns, in bytes. By default 16 MiB, the scheduler's
    /// default payload limit.
    pub max_read: u64,
}

impl Default for FilesSettings {
    fn default() -> Self {
        FilesSettings { max_read: 16 << 20 }
    }
}

/// The `fs` provider. Cheap to clone; its [`FILE_THREADS`] threads serve every clone,
/// and every provider made from it with [`Files::within`].
#[derive(Clone)]
pub struct Files {
    pool: Arc<Pool<Job>>,
    /// The grants of this handle's commands, with their directories open.
    roots: Arc<[Root]>,
    settings: Arc<FilesSettings>,
}

/// Threads that carry out jobs, each job on whichever thread is free, in the order they
/// were submitted. A job that blocks holds its thread only: the others go on taking the
/// jobs behind it. Dropping the pool lets the threads finish what is queued, then joins
/// them.
struct Pool<J> {
    /// `None` once dropping: closing the queue ends the threads.
    jobs: Mutex<Option<mpsc::Sender<J>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<J: Send + 'static> Pool<J> {
    /// `threads` threads named `name`, each carrying out jobs with `work`.
    fn new(threads: usize, name: &str, work: impl Fn(J) + Send + Sync + 'static) -> io::Result<Pool<J>> {
        let (jobs, queue) = mpsc::channel::<J>();
        let pool = Pool { jobs: Mutex::new(Some(jobs)), threads: Mutex::new(Vec::with_capacity(threads)) };
        let shared = Arc::new((work, Mutex::new(queue)));
        for _ in 0..threads {
            let shared = shared.clone();
            // A thread that fails to start drops the pool, which joins those started.
            let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
                let (work, queue) = &*shared;
                // The lock is held only while waiting for the next job, never while one runs.
                while let Ok(job) = { queue.lock().recv() } {
                    work(job);
                }
            })?;
            pool.threads.lock().push(thread);
        }
        Ok(pool)
    }

    /// Queues `job` for the next free thread; hands it back if the threads are gone.
    fn submit(&self, job: J) -> Result<(), J> {
        match self.jobs.lock().as_ref() {
            Some(jobs) => jobs.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}

impl<J> Drop for Pool<J> {
    fn drop(&mut self) {
        // Closing the queue ends the threads once they have carried out what is queued.
        self.jobs.lock().take();
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
    }
}

struct Job {
    name: String,
    payload: Payload,
    roots: Arc<[Root]>,
    settings: Arc<FilesSettings>,
    done: Completer,
}

/// A grant with its directory open.
struct Root {
    dir: File,
    guest: PathBuf,
    writable: bool,
}

impl Files {
    /// Opens every granted directory and starts the file threads.
    ///
    /// # Errors
    ///
    /// A directory that cannot be opened, a guest path that is not absolute, or a
    /// thread could not start.
    pub fn new(grants: Vec<Grant>, settings: FilesSettings) -> anyhow::Result<Files> {
        let roots = open_roots(grants)?;
        let pool = Pool::new(FILE_THREADS, "wasmproc-fs", move |job: Job| {
            let result = run(&job.roots, &job.settings, &job.name, &job.payload);
            job.done.complete(result);
        })?;
        Ok(Files { pool: Arc::new(pool), roots, settings: Arc::new(settings) })
    }

    /// A provider of `grants` instead, on the same threads with the same settings: for
    /// hosts that grant each process directories of its own (the service's workflows).
    ///
    /// # Errors
    ///
    /// A directory that cannot be opened, or a guest path that is not absolute.
    pub fn within(&self, grants: Vec<Grant>) -> anyhow::Result<Files> {
        Ok(Files { pool: self.pool.clone(), roots: open_roots(grants)?, settings: self.settings.clone() })
    }
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let guests: Vec<_> = self.roots.iter().map(|root| (&root.guest, root.writable)).collect();
        f.debug_struct("Files").field("grants", &guests).finish_non_exhaustive()
    }
}

/// Opens every granted directory; the longest guest path first, so the most specific
/// grant answers.
fn open_roots(grants: Vec<Grant>) -> anyhow::Result<Arc<[Root]>> {
    let mut roots = Vec::with_capacity(grants.len());
    for grant in grants {
        let guest = normal_guest_path(&grant.guest)
            .map_err(|e| anyhow::anyhow!("the guest path `{}` of `{}`: {e}", grant.guest, grant.host.display()))?;
        let dir = cap_primitives::fs::open_ambient_dir(&grant.host, cap_primitives::ambient_authority())
            .map_err(|e| anyhow::anyhow!("cannot open the directory `{}`: {e}", grant.host.display()))?;
        roots.push(Root { dir, guest, writable: grant.writable });
    }
    roots.sort_by_key(|root| std::cmp::Reverse(root.guest.components().count()));
    Ok(roots.into())
}

impl Provider for Files {
    fn family(&self) -> &str {
        "fs"
    }

    fn handle(&self, request: Request<'_>) {
        let name = request.name().to_owned();
        let (payload, done) = request.into_parts();
        // Refused only once the threads are gone; the job's completer, dropped with it,
        // then answers with an error.
        let job = Job { name, payload, roots: self.roots.clone(), settings: self.settings.clone(), done };
        let _ = self.pool.submit(job);
    }

    fn reads_only(&self, name: &str) -> bool {
        matches!(name, "fs.read" | "fs.list" | "fs.stat")
    }
}

#[derive(Deserialize)]
struct PathInput {
    path: String,
}

#[derive(Deserialize)]
struct WriteInput {
    path: String,
    text: Option<String>,
    data: Option<Vec<u8>>,
    #[serde(default)]
    append: bool,
}

#[derive(Serialize)]
struct Entry {
    name: String,
    kind: &'static str,
    size: u64,
}

fn run(roots: &[Root], settings: &FilesSettings, name: &str, payload: &Payload) -> crate::Outcome {
    let command = name.strip_prefix("fs.").unwrap_or(name);
    match command {
        "read" => match read(roots, settings, name, payload) {
            Ok(bytes) => Ok(Payload::bytes(bytes)),
            Err(failure) => Err(failure.into()),
        },
        "write" => answer(write(roots, name, payload)),
        "list" => answer(list(roots, name, payload)),
        "stat" => answer(stat(roots, name, payload)),
        "mkdir" => answer(change(roots, name, payload, |dir, path| {
            cap_primitives::fs::create_dir(dir, path, &DirOptions::new())
        })),
        "remove" => answer(change(roots, name, payload, remove)),
        _ => answer::<()>(Err(unknown(name, "fs", &COMMANDS))),
    }
}

fn read(roots: &[Root], settings: &FilesSettings, name: &str, payload: &Payload) -> Result<Vec<u8>, Failure> {
    let PathInput { path } = input(name, payload)?;
    let (root, rest) = resolve(roots, &path, false)?;
    let file = open_regular(root, &rest, &path, OpenOptions::new().read(true))?;
    let mut bytes = Vec::new();
    // One byte past the limit tells a file at the limit from one over it without
    // reading the rest.
    file.take(settings.max_read + 1).read_to_end(&mut bytes).map_err(|e| io_failure(&path, e))?;
    if bytes.len() as u64 > settings.max_read {
        return Err(Failure::new(
            ErrorCode::Limit,
            format!("`{path}` is larger than the {}-byte read limit", settings.max_read),
        ));
    }
    Ok(bytes)
}

fn write(roots: &[Root], name: &str, payload: &Payload) -> Result<serde_json::Value, Failure> {
    let WriteInput { path, text, data, append } = input(name, payload)?;
    let bytes = match (text, data) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(data)) => data,
        _ => return Err(Failure::new(ErrorCode::Invalid, "`fs.write` takes one of `text` and `data`")),
    };
    let (root, rest) = resolve(roots, &path, true)?;
    // Refused before it is opened: opening a FIFO to write fails without a reader, and a
    // truncation would reach a device. The type is checked again on what was opened.
    match cap_primitives::fs::stat(&root.dir, &rest, FollowSymlinks::Yes) {
        Ok(metadata) if !metadata.is_file() => return Err(not_regular(&path, metadata.file_type())),
        _ => {}
    }
    let mut options = OpenOptions::new();
    options.write(true).create(true);
    if append {
        options.append(true);
    } else {
        options.truncate(true);
    }
    let mut file = open_regular(root, &rest, &path, &options)?;
    file.write_all(&bytes).map_err(|e| io_failure(&path, e))?;
    Ok(serde_json::json!({ "bytes": bytes.len() }))
}

fn list(roots: &[Root], name: &str, payload: &Payload) -> Result<serde_json::Value, Failure> {
    let PathInput { path } = input(name, payload)?;
    let (root, rest) = resolve(roots, &path, false)?;
    let entries = if rest.as_os_str().is_empty() {
        cap_primitives::fs::read_base_dir(&root.dir)
    } else {
        cap_primitives::fs::read_dir(&root.dir, &rest)
    }
    .map_err(|e| io_failure(&path, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_failure(&path, e))?;
        let metadata = entry.metadata().map_err(|e| io_failure(&path, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        out.push(Entry { name, kind: kind(metadata.file_type()), size: metadata.len() });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(serde_json::json!({ "entries": out }))
}

fn stat(roots: &[Root], name: &str, payload: &Payload) -> Result<serde_json::Value, Failure> {
    let PathInput { path } = input(name, payload)?;
    let (root, rest) = resolve(roots, &path, false)?;
    let metadata = if rest.as_os_str().is_empty() {
        root.dir.metadata().map(cap_primitives::fs::Metadata::from_just_metadata)
    } else {
        cap_primitives::fs::stat(&root.dir, &rest, FollowSymlinks::No)
    }
    .map_err(|e| io_failure(&path, e))?;
    let modified_ms = metadata
        .modified()
        .ok()
        .and_then(|t| t.into_std().duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64);
    Ok(serde_json::json!({ "kind": kind(metadata.file_type()), "size": metadata.len(), "modified_ms": modified_ms }))
}

/// `fs.mkdir` and `fs.remove`: a change in a writable grant, answered `{}`.
fn change(
    roots: &[Root],
    name: &str,
    payload: &Payload,
    act: impl FnOnce(&File, &Path) -> io::Result<()>,
) -> Result<serde_json::Value, Failure> {
    let PathInput { path } = input(name, payload)?;
    let (root, rest) = resolve(roots, &path, true)?;
    if rest.as_os_str().is_empty() {
        return Err(Failure::new(ErrorCode::Denied, format!("`{path}` is a granted directory itself")));
    }
    act(&root.dir, &rest).map_err(|e| io_failure(&path, e))?;
    Ok(serde_json::json!({}))
}

fn remove(dir: &File, path: &Path) -> io::Result<()> {
    match cap_primitives::fs::stat(dir, path, FollowSymlinks::No)?.file_type().is_dir() {
        true => cap_primitives::fs::remove_dir(dir, path),
        false => cap_primitives::fs::remove_file(dir, path),
    }
}

/// Opens `rest` in `root` with `options`, without blocking (`O_NONBLOCK`: a FIFO opens at
/// once, and a file under another program's lease answers at once), and refuses what is
/// not a regular file.
fn open_regular(root: &Root, rest: &Path, path: &str, options: &OpenOptions) -> Result<File, Failure> {
    use cap_primitives::fs::OpenOptionsExt as _;
    let mut options = options.clone();
    options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    let file = cap_primitives::fs::open(&root.dir, rest, &options).map_err(|e| io_failure(path, e))?;
    let metadata = file.metadata().map_err(|e| io_failure(path, e))?;
    if !metadata.is_file() {
        return Err(not_regular(path, cap_primitives::fs::Metadata::from_just_metadata(metadata).file_type()));
    }
    Ok(file)
}

/// The refusal of a special file (a FIFO, a device, a socket) or a directory.
fn not_regular(path: &str, file_type: cap_primitives::fs::FileType) -> Failure {
    use cap_primitives::fs::FileTypeExt as _;
    let what = if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Failure::new(
        ErrorCode::Invalid,
        format!("`{path}` is {what}, not a regular file: only regular files are read and written"),
    )
}

fn kind(file_type: cap_primitives::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "file"
    } else if file_type.is_dir() {
        "dir"
    } else if file_type.is_symlink() {
        "symlink"
    } else {
        "other"
    }
}

/// The grant that holds the guest path `path`, and the path relative to its directory.
fn resolve<'r>(roots: &'r [Root], path: &str, write: bool) -> Result<(&'r Root, PathBuf), Failure> {
    let normal = normal_guest_path(path).map_err(|e| Failure::new(ErrorCode::Invalid, format!("`{path}`: {e}")))?;
    let Some((root, rest)) = roots.iter().find_map(|root| Some((root, normal.strip_prefix(&root.guest).ok()?))) else {
        return Err(Failure::new(
            ErrorCode::Denied,
            format!("`{path}` is outside the granted directories (grant one with --dir HOST::GUEST)"),
        ));
    };
    if write && !root.writable {
        return Err(Failure::new(
            ErrorCode::Denied,
            format!(
                "`{path}` is in `{}`, granted read-only (grant it with --dir-rw HOST::{})",
                root.guest.display(),
                root.guest.display()
            ),
        ));
    }
    Ok((root, rest.to_path_buf()))
}

/// `path` as an absolute path of normal components: `.` dropped, `..` refused, since a
/// guest path never leaves its grant.
fn normal_guest_path(path: &str) -> Result<PathBuf, &'static str> {
    let path = Path::new(path);
    if !path.has_root() {
        return Err("a guest path is absolute (starts with `/`)");
    }
    let mut normal = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => normal.push(part),
            Component::ParentDir => return Err("a guest path has no `..`"),
            Component::Prefix(_) => return Err("a guest path has no drive prefix"),
        }
    }
    Ok(normal)
}

fn io_failure(path: &str, error: io::Error) -> Failure {
    let code = match error.kind() {
        io::ErrorKind::NotFound => ErrorCode::NotFound,
        io::ErrorKind::PermissionDenied => ErrorCode::Denied,
        io::ErrorKind::InvalidInput | io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty => {
            ErrorCode::Invalid
        }
        _ => ErrorCode::Unavailable,
    };
    Failure::new(code, format!("`{path}`: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::PATIENCE;

    /// One job blocks its thread (as a read of a file on a stalled network file system
    /// would) until every job queued behind it has been answered: the pool the file
    /// commands run on answers them from its other threads. With one thread it could not:
    /// the blocked job would hold every other behind it.
    #[test]
    fn a_blocked_job_leaves_the_other_threads_serving() {
        type Work = Box<dyn FnOnce() + Send>;
        let pool = Pool::new(FILE_THREADS, "wasmproc-fs-test", |job: Work| job()).unwrap();
        let (release, released) = mpsc::channel::<()>();
        let (answers, answered) = mpsc::channel::<Result<usize, bool>>();
        let blocked = answers.clone();
        let blocking: Work = Box::new(move || {
            let _ = blocked.send(Err(released.recv_timeout(PATIENCE).is_ok()));
        });
        assert!(pool.submit(blocking).is_ok());
        let others = 4 * FILE_THREADS;
        for n in 0..others {
            let answers = answers.clone();
            let job: Work = Box::new(move || {
                let _ = answers.send(Ok(n));
            });
            assert!(pool.submit(job).is_ok());
        }
        let mut seen = Vec::new();
        for _ in 0..others {
            match answered.recv_timeout(PATIENCE) {
                Ok(Ok(n)) => seen.push(n),
                Ok(Err(_)) => panic!("the blocked job gave up waiting while the others were held up: {seen:?}"),
                Err(_) => panic!("a blocked job held up the others: answered only {seen:?}"),
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..others).collect::<Vec<_>>());
        release.send(()).unwrap();
        assert_eq!(answered.recv_timeout(PATIENCE), Ok(Err(true)), "the blocked job ends once released");
    }

    #[test]
    fn guest_paths_are_absolute_and_never_climb() {
        assert_eq!(normal_guest_path("/data/./a/b").unwrap(), PathBuf::from("/data/a/b"));
        assert!(normal_guest_path("data/a").is_err());
        assert!(normal_guest_path("/data/../etc").is_err());
    }
}
