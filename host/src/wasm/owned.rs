//! Files and directories that only this user can have written, checked as ssh checks its
//! own: the compiled-code cache (`cache.rs`) and the key that authenticates it (`key.rs`).
//!
//! A file is read only if it is a regular file (never a symlink, FIFO, device or
//! directory: one is refused before it is opened, and the open itself neither follows a
//! symlink nor blocks, in case the name was swapped in between), owned by the effective
//! user, not writable by group or others (nor readable, for a private file), and of a
//! size below a cap. The checks that decide are made on the open file (`fstat`), so a
//! name replaced between the check and the open cannot slip through.

use std::fs::{self, File, Metadata};
use std::io::{self, Read as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// Why a file or directory was not used.
#[derive(Debug)]
pub(crate) enum Refused {
    /// There is no such file.
    Missing,
    /// Someone other than this user could have written it (or, for a private file, read
    /// it): the text says who owns it or what its mode allows, and what to do.
    Untrusted(String),
    /// Not a regular file (or directory), out of bounds, or an I/O error: the text says
    /// which.
    Unusable(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Missing => f.write_str("it does not exist"),
            Refused::Untrusted(why) | Refused::Unusable(why) => f.write_str(why),
        }
    }
}

/// Who may have written (or read) a file besides its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Group and others may read it, not write it (a cache entry: not secret, but code).
    Shared,
    /// Only the owner may read or write it (the key).
    Private,
}

impl Access {
    /// The mode bits that must be clear.
    fn forbidden(self) -> u32 {
        match self {
            Access::Shared => 0o022,
            Access::Private => 0o077,
        }
    }
}

/// The effective user id: the user whose files these must be.
pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Checks that `meta` (of `path`) is owned by this user and does not allow what `access`
/// forbids.
fn check_owner(path: &Path, meta: &Metadata, access: Access) -> Result<(), Refused> {
    let me = euid();
    if meta.uid() != me {
        return Err(Refused::Untrusted(format!(
            "`{}` is owned by uid {}, not by this user (uid {me}): remove it, or `chown` it to this user",
            path.display(),
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    let bad = mode & access.forbidden();
    if bad != 0 {
        let fix = if access == Access::Private { "go-rwx" } else { "go-w" };
        return Err(Refused::Untrusted(format!(
            "`{}` has mode {mode:o}, which lets others {}: `chmod {fix} {}`",
            path.display(),
            if bad & 0o022 != 0 { "write it" } else { "read it" },
            path.display()
        )));
    }
    Ok(())
}

/// Checks that `dir` is a directory of this user's that only this user may write: what
/// ssh asks of `~/.ssh`. A symlink to such a directory is followed (a cache directory on
/// another disk is common); the directory it leads to is the one checked.
pub(crate) fn check_dir(dir: &Path) -> Result<(), Refused> {
    let meta = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Refused::Missing),
        Err(e) => return Err(Refused::Unusable(format!("cannot read `{}`: {e}", dir.display()))),
    };
    if !meta.is_dir() {
        return Err(Refused::Unusable(format!("`{}` is not a directory", dir.display())));
    }
    check_owner(dir, &meta, Access::Shared)
}

/// Creates `dir` and its missing parents with mode 0700 (only the created ones; an
/// existing parent is left as it is), then checks it with [`check_dir`].
pub(crate) fn create_dir(dir: &Path) -> Result<(), Refused> {
    match check_dir(dir) {
        Err(Refused::Missing) => {}
        checked => return checked,
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Refused::Unusable(format!("cannot create `{}`: {e}", dir.display())))?;
    check_dir(dir)
}

/// The contents of the regular file `path`, if it passes the checks of the module docs
/// for `access` and is at most `max_len` bytes long.
pub(crate) fn read(path: &Path, access: Access, max_len: u64) -> Result<Vec<u8>, Refused> {
    // Refuse what is plainly not a regular file without opening it at all: opening a
    // device can have effects of its own.
    match fs::symlink_metadata(path) {
        Ok(meta) => check_type(path, &meta)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Refused::Missing),
        Err(e) => return Err(Refused::Unusable(format!("cannot read `{}`: {e}", path.display()))),
    }
    // The name may have been replaced since: `NOFOLLOW` fails on a symlink (`ELOOP`),
    // `NONBLOCK` makes opening a FIFO return at once, and the `fstat` below decides.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(rustix::io::Errno::NOENT) => return Err(Refused::Missing),
        Err(rustix::io::Errno::LOOP) => {
            return Err(Refused::Unusable(format!("`{}` is a symbolic link", path.display())));
        }
        Err(e) => return Err(Refused::Unusable(format!("cannot open `{}`: {e}", path.display()))),
    };
    let meta = file.metadata().map_err(|e| Refused::Unusable(format!("cannot stat `{}`: {e}", path.display())))?;
    check_type(path, &meta)?;
    check_owner(path, &meta, access)?;
    if meta.len() > max_len {
        return Err(Refused::Unusable(format!(
            "`{}` is {} bytes, more than the {max_len} such a file may have",
            path.display(),
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // `take` bounds the read should the file grow after the `fstat`.
    file.take(max_len.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Refused::Unusable(format!("cannot read `{}`: {e}", path.display())))?;
    if bytes.len() as u64 > max_len {
        return Err(Refused::Unusable(format!("`{}` grew past {max_len} bytes while read", path.display())));
    }
    Ok(bytes)
}

fn check_type(path: &Path, meta: &Metadata) -> Result<(), Refused> {
    let ty = meta.file_type();
    if ty.is_file() {
        return Ok(());
    }
    let what = if ty.is_symlink() {
        "a symbolic link"
    } else if ty.is_dir() {
        "a directory"
    } else {
        "a FIFO, socket or device"
    };
    Err(Refused::Unusable(format!("`{}` is {what}, not a regular file", path.display())))
}

/// Creates `path` anew (never through a symlink, never over an existing file) with only
/// the owner allowed to read and write it: the temporary files that are renamed or linked
/// into place.
pub(crate) fn create_new(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    // The mode given to `open` is masked by the umask; 0600 under any umask is 0600 or
    // less, but set it exactly so a umask of 0 changes nothing either.
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("wasmproc-owned-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn only_regular_files_of_this_user_that_others_cannot_write_are_read() {
        let dir = scratch("read");
        let file = dir.join("entry");
        fs::write(&file, b"code").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read(&file, Access::Shared, 100).unwrap(), b"code");
        assert!(matches!(read(&file, Access::Private, 100), Err(Refused::Untrusted(_))));
        assert!(matches!(read(&file, Access::Shared, 3), Err(Refused::Unusable(_))));
        fs::set_permissions(&file, fs::Permissions::from_mode(0o664)).unwrap();
        let Err(Refused::Untrusted(why)) = read(&file, Access::Shared, 100) else { panic!("group-writable is read") };
        assert!(why.contains("chmod go-w"), "{why}");

        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(read(&link, Access::Shared, 100), Err(Refused::Unusable(_))));
        assert!(matches!(read(&dir.join("absent"), Access::Shared, 100), Err(Refused::Missing)));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn directories_writable_by_others_are_refused() {
        let dir = scratch("dir");
        check_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(check_dir(&dir), Err(Refused::Untrusted(_))));
        let nested = dir.join("a/b");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        create_dir(&nested).unwrap();
        assert_eq!(fs::metadata(&nested).unwrap().mode() & 0o777, 0o700);
        let _ = fs::remove_dir_all(&dir);
    }
}
