//! The per-user secret key that authenticates the compiled code wasmproc reads back from
//! disk: the entries of the disk cache (`cache.rs`) and the files `wasmproc compile`
//! makes (`precompiled.rs`).
//!
//! # Why a key
//!
//! Compiled code is native code: loading it trusts it as much as the host binary. A
//! checksum catches accidents only, since whoever can write the file can recompute it; a
//! name (the module's hash) binds nothing, since an entry can be copied over another
//! name. An HMAC-SHA256 under a key that only this user can read cannot be made without
//! the key, and it covers what the code is *for* (the module's digest, the engine's
//! settings, the kind of code) as well as the code: an entry that verifies was written by
//! this user's wasmproc, for this module and this engine, and not altered since.
//!
//! # Where the key lives
//!
//! `$XDG_CONFIG_HOME/wasmproc/cache.key`, else `$HOME/.config/wasmproc/cache.key`:
//! outside the cache directory on purpose. A cache is what gets shared, restored from a
//! CI cache made elsewhere, synced between machines or pointed at a common directory
//! with `XDG_CACHE_HOME`; a key beside the entries would travel with them, and whoever
//! could plant entries could plant the key that vouches for them. The configuration
//! directory is this user's own and is not what such tools copy. With
//! [`Config::cache_dir`](super::Config::cache_dir) (a library user or a test choosing a
//! directory of its own) the key is `<dir>/key` instead, so that such a runtime touches
//! nothing outside its directory; that directory must pass the same checks as the key's
//! (below), so only this user can write the key or the entries.
//!
//! Losing the key costs little: cached modules compile again, and files made by
//! `wasmproc compile` must be made again (or loaded with `--trust-precompiled`).
//!
//! # Reading and creating it
//!
//! 1. The key's directory must be this user's and writable by no one else, as for ssh's
//!    `~/.ssh` (created with mode 0700 if missing).
//! 2. If the key exists it is used only if it is a regular file of exactly [`KEY_LEN`]
//!    bytes, owned by this user, neither readable nor writable by group or others (as
//!    ssh treats a private key), opened without following a symlink or blocking (see
//!    `owned.rs`). Anything else is an error; the file is not read.
//! 3. If it does not exist, [`KEY_LEN`] random bytes are written to a new temporary file
//!    of mode 0600 beside it, which is then `link`ed to the key's name. `link` never
//!    replaces a file: of two hosts creating the key at once, one links first and the
//!    other gets `AlreadyExists`, drops its own file and reads the winner's (step 2). So
//!    both use the same key, and since the file is complete before it has the key's
//!    name, no reader ever sees part of a key.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, anyhow};
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use super::owned::{self, Access, Refused};

/// Bytes of a key: 256 bits, the strength of SHA-256.
pub(crate) const KEY_LEN: usize = 32;

/// Bytes of a tag (an HMAC-SHA256).
pub(crate) const TAG_LEN: usize = 32;

/// A secret key of this user's.
pub(crate) struct Key([u8; KEY_LEN]);

type HmacSha256 = Hmac<Sha256>;

impl Key {
    /// The HMAC of `parts`. Each part is preceded by its length, so that no two different
    /// lists of parts are the same byte stream; the first part should name what is
    /// authenticated (a cache entry, a precompiled file), so that a tag of one can never
    /// pass as a tag of the other.
    pub(crate) fn tag(&self, parts: &[&[u8]]) -> [u8; TAG_LEN] {
        self.mac(parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `parts`, compared in constant time (`verify_slice`), so
    /// that the time a refusal takes says nothing about how much of a guess was right.
    pub(crate) fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(parts).verify_slice(tag).is_ok()
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        for part in parts {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac
    }
}

/// Where a runtime's key is, read or created the first time it is needed (a run of a
/// `.wasm` file with the cache off never needs it). A runtime tries once: the outcome,
/// key or error, is kept.
pub(crate) struct KeyFile {
    path: Option<PathBuf>,
    key: OnceLock<Result<Key, String>>,
}

impl KeyFile {
    /// The key at `path`; `None` when there is nowhere to keep one (no `HOME`).
    pub(crate) fn new(path: Option<PathBuf>) -> Self {
        KeyFile { path, key: OnceLock::new() }
    }

    /// The key, read or created as the module docs say.
    ///
    /// # Errors
    ///
    /// There is no place for a key, or the key or its directory failed a check (the
    /// error names the file and what to do).
    pub(crate) fn get(&self) -> anyhow::Result<&Key> {
        let key = self.key.get_or_init(|| {
            let path = self.path.as_deref().ok_or_else(|| {
                "there is no place for this user's key (neither `XDG_CONFIG_HOME` nor `HOME` is set)".to_owned()
            })?;
            load_or_create(path).map_err(|e| format!("{e:#}"))
        });
        key.as_ref().map_err(|e| anyhow!("{e}"))
    }
}

/// Steps 1 to 3 of the module docs.
fn load_or_create(path: &Path) -> anyhow::Result<Key> {
    let dir = path.parent().context("the key's path has no directory")?;
    owned::create_dir(dir).map_err(|e| anyhow!("unsafe directory for the key: {e}"))?;
    // Step 3 loops back to step 2 at most once: a key that another host linked stays.
    for _ in 0..2 {
        match owned::read(path, Access::Private, KEY_LEN as u64) {
            Ok(bytes) => {
                let key: [u8; KEY_LEN] = bytes.try_into().map_err(|bytes: Vec<u8>| {
                    anyhow!(
                        "the key `{}` has {} bytes instead of {KEY_LEN}: delete it to make a new one",
                        path.display(),
                        bytes.len()
                    )
                })?;
                return Ok(Key(key));
            }
            Err(Refused::Missing) => create(path)?,
            Err(refused) => anyhow::bail!("refusing the key: {refused}"),
        }
    }
    anyhow::bail!("the key `{}` vanished as soon as it was made", path.display())
}

/// Makes a new key at `path` unless one appears there first (step 3 of the module docs).
fn create(path: &Path) -> anyhow::Result<()> {
    let mut key = [0; KEY_LEN];
    getrandom::fill(&mut key).map_err(|e| anyhow!("cannot draw a random key: {e}"))?;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    let temp = path.with_file_name(name);
    let made = (|| -> std::io::Result<()> {
        let mut file = owned::create_new(&temp)?;
        file.write_all(&key)?;
        file.sync_all()?;
        match std::fs::hard_link(&temp, path) {
            // Another host made the key first: the caller reads theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            linked => linked,
        }
    })();
    let _ = std::fs::remove_file(&temp);
    made.with_context(|| format!("cannot create the key `{}`", path.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wasmproc-key-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_key_is_made_private_once_and_read_back() {
        let dir = scratch("made");
        let path = dir.join("cache.key");
        let first = KeyFile::new(Some(path.clone()));
        let tag = first.get().unwrap().tag(&[b"test", b"abc"]);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let second = KeyFile::new(Some(path.clone()));
        assert!(second.get().unwrap().verify(&[b"test", b"abc"], &tag));
        assert!(!second.get().unwrap().verify(&[b"test", b"abd"], &tag));
        // Length prefixes: moving a byte from one part to the next changes the tag.
        assert!(!second.get().unwrap().verify(&[b"testa", b"bc"], &tag));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hosts_creating_the_key_at_once_end_with_the_same_key() {
        let dir = scratch("race");
        let path = dir.join("cache.key");
        let tags: Vec<_> = std::thread::scope(|scope| {
            let racers: Vec<_> =
                (0..8).map(|_| scope.spawn(|| KeyFile::new(Some(path.clone())).get().unwrap().tag(&[b"x"]))).collect();
            racers.into_iter().map(|racer| racer.join().unwrap()).collect()
        });
        assert!(tags.windows(2).all(|pair| pair[0] == pair[1]), "every racer uses the winner's key");
        let leftovers = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary file is left");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_key_others_can_read_or_of_another_user_is_refused_unread() {
        let dir = scratch("refused");
        let path = dir.join("cache.key");
        KeyFile::new(Some(path.clone())).get().unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let error = KeyFile::new(Some(path.clone())).get().err().expect("a readable key is refused").to_string();
        assert!(error.contains("chmod go-rwx"), "{error}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        if owned::euid() == 0 {
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            let error = KeyFile::new(Some(path.clone())).get().err().expect("another user's key is refused");
            assert!(error.to_string().contains("owned by uid 65534"), "{error}");
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"short").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = KeyFile::new(Some(path.clone())).get().err().expect("a short key is refused").to_string();
        assert!(error.contains("has 5 bytes instead of 32"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
