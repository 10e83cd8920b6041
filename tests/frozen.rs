//! A file system that stalls every write, for the tests of what a provider does while
//! one of its files does not answer: a small ext4 image mounted on a loop device, then
//! frozen (`fsfreeze`, what snapshot tools do), so that every write to it blocks in the
//! kernel until it is thawed. Reads still answer. Nothing is faked: the provider's
//! thread is stuck in the same system call as on a stalled disk.
//!
//! Mounting needs root (with `CAP_SYS_ADMIN`) and a loop device; [`Mount::new`] says
//! whether this machine can, and the tests that need it are skipped, saying so, where
//! it cannot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// An ext4 image mounted on a directory, unmounted (and its loop device freed) on drop.
pub struct Mount {
    dir: PathBuf,
}

impl Mount {
    /// Makes a 16 MiB ext4 image in `scratch` (emptied first, and unmounted if an
    /// earlier run left it mounted) and mounts it on `scratch/mnt`; `None`, after saying
    /// why on stderr, when this process is not root.
    ///
    /// # Panics
    ///
    /// Root cannot make or mount the image (`mkfs.ext4`, `mount -o loop`).
    pub fn new(scratch: &Path) -> Option<Mount> {
        if !is_root() {
            eprintln!("skipped: mounting a file system to freeze needs root");
            return None;
        }
        let image = scratch.join("fs.img");
        let dir = scratch.join("mnt");
        let _ = Command::new("umount").arg("--lazy").arg(&dir).stderr(std::process::Stdio::null()).status();
        let _ = std::fs::remove_dir_all(scratch);
        std::fs::create_dir_all(&dir).expect("a mount point");
        std::fs::File::create(&image).and_then(|f| f.set_len(16 << 20)).expect("an image file");
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&dir));
        Some(Mount { dir })
    }

    /// The mounted file system's root.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Freezes it: every write to it blocks until the [`Frozen`] is dropped.
    pub fn freeze(&self) -> Frozen<'_> {
        run(Command::new("fsfreeze").arg("--freeze").arg(&self.dir));
        Frozen { mount: self }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazily: a provider that failed a test may still hold a file open in it.
        let _ = Command::new("umount").arg("--lazy").arg(&self.dir).status();
    }
}

/// A frozen [`Mount`], thawed on drop: drop it before whatever waits on its writes
/// (a provider whose threads are joined when it is dropped).
pub struct Frozen<'a> {
    mount: &'a Mount,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("--unfreeze").arg(&self.mount.dir).status();
    }
}

/// Waits, at most `patience`, until a thread of this process named `name` sleeps
/// uninterruptibly in the kernel (state `D`: blocked on the frozen file system); whether
/// one did.
pub fn wait_for_thread_blocked(name: &str, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        if thread_blocked(name) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn thread_blocked(name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return false };
    tasks.flatten().any(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // `pid (comm) S …`: the state follows the last `)`, as comm may hold one.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
        comm.trim_end() == name && state == Some("D")
    })
}

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    // `Uid:	real	effective	saved	fs`
    let effective = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1));
    effective == Some("0")
}

fn run(command: &mut Command) {
    let status = command.status().unwrap_or_else(|e| panic!("{command:?} runs: {e}"));
    assert!(status.success(), "{command:?} failed: {status}");
}
