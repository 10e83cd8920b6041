//! Compile once: the disk cache of compiled components.
//!
//! An entry is named by the SHA-256 of the component's bytes and by a hash of everything
//! about the engine that compiled code depends on (wasmtime's version, its settings, the
//! CPU features), so a module is found again whatever its path, and an upgrade or a new
//! setting simply misses. Each file is `MAGIC`, the kind of artefact (component or core
//! module), the file it was compiled from as its loader named it (a little-endian `u16`
//! length, then UTF-8; shown by `wasmproc cache ls`, trusted for nothing), a tag, then
//! wasmtime's serialization of it.
//!
//! # Trust
//!
//! An entry is native code, so a name is not enough to trust it (an entry copied over
//! another module's name would run the wrong module), nor a checksum (whoever can write
//! the file can recompute it). The tag is an HMAC-SHA256, under this user's secret key
//! (`key.rs`), of the module's digest, the engine key, the kind and the serialized code:
//! only this user's wasmproc can make one, and it binds the code to the module and the
//! engine it was compiled for. It is verified before anything is deserialized; a torn,
//! corrupted, copied or forged entry fails it and the module is compiled instead.
//!
//! As ssh does, the cache directory and each entry are used only when they are owned by
//! this user and writable by no one else; entries are opened without following symlinks
//! or blocking, and only regular files of at most [`MAX_ENTRY`] bytes are read
//! (`owned.rs`). A directory that fails is neither read nor written, and the first
//! refusal of a runtime is a `tracing` warning naming the path and what to do (later ones
//! are debug events): loading still succeeds, by compiling.
//!
//! Writes go to a new temporary file that is renamed into place, so readers never see a
//! partial entry, and two hosts compiling the same module at once both succeed (the last
//! rename wins; both files are equally good). Every cache failure is logged and
//! otherwise ignored: the cache makes loading faster, never fails it.
//!
//! # Size
//!
//! The entries are kept to [`Config::max_cache_size`] (1 GiB by default) in total: after
//! each write, the least recently used are removed until the rest fit, never the entry
//! just written. An entry's last use is its access time, which every load sets
//! (explicitly, whatever the mount's `noatime`); its modification time is when it was
//! written. [`CompiledCache`] lists and removes entries for the user (`wasmproc cache`).
//! Only files named as entries are counted or removed (and temporary files an interrupted
//! write left, once they are an hour old): whatever else the directory holds is left
//! alone, and a directory that fails the checks above is neither listed nor cleaned.
//! Removing an entry another host is reading is harmless (the reader keeps the open
//! file); one it is about to read is a miss, and it compiles.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crate::codec::hex;
use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Module};

use super::config::Config;
use super::key::{Key, KeyFile, TAG_LEN};
use super::owned::{self, Access, Refused};

/// The first bytes of a cache file; bump the digit when the layout changes (entries of
/// another digit are replaced quietly).
const MAGIC: &[u8; 8] = b"wasmpc4\n";

/// The most bytes of an entry's source name kept: a path of any sensible length.
const MAX_SOURCE: usize = 1024;

/// What the first part of an entry's tag says it is: no tag of a precompiled file (which
/// names itself otherwise) can pass for an entry's.
const TAG_LABEL: &[u8] = b"wasmproc cache entry";

/// The largest entry that is read: far above the code of any module within the compile
/// limits (`limits.rs`), low enough that a planted huge file costs no more than this.
const MAX_ENTRY: u64 = 1 << 30;

/// Compiled code: a component, or a core module (WASI preview 1 programs).
#[derive(Clone)]
pub(crate) enum Compiled {
    Component(Component),
    Module(Module),
}

impl Compiled {
    /// The byte that names this kind in cache files and precompiled files.
    pub(crate) fn kind_byte(&self) -> u8 {
        match self {
            Compiled::Component(_) => b'c',
            Compiled::Module(_) => b'm',
        }
    }

    pub(crate) fn serialize(&self) -> anyhow::Result<Vec<u8>> {
        match self {
            Compiled::Component(component) => component.serialize(),
            Compiled::Module(module) => module.serialize(),
        }
        .map_err(anyhow::Error::from)
        .context("failed to serialize the compiled code")
    }

    /// Loads what [`Compiled::serialize`] wrote.
    ///
    /// # Safety
    ///
    /// `serialized` must be bytes that `serialize` produced for a `kind` artefact,
    /// unaltered (wasmtime's own contract for `deserialize`): anything else is undefined
    /// behaviour, because it is loaded as native code.
    pub(crate) unsafe fn deserialize(engine: &Engine, kind: u8, serialized: &[u8]) -> anyhow::Result<Compiled> {
        // SAFETY: passed on to the caller (see above).
        let compiled = match kind {
            b'c' => Compiled::Component(unsafe { Component::deserialize(engine, serialized) }?),
            b'm' => Compiled::Module(unsafe { Module::deserialize(engine, serialized) }?),
            other => bail!("unknown kind of compiled code {other:#04x}"),
        };
        Ok(compiled)
    }
}

/// A SHA-256 digest.
pub(crate) type Digest = [u8; 32];

pub(crate) fn digest(bytes: &[u8]) -> Digest {
    Sha256::digest(bytes).into()
}

/// Compiled components on disk, for one engine.
pub(crate) struct DiskCache {
    dir: PathBuf,
    /// The most bytes the entries may take together; see the module docs, "Size".
    max_size: u64,
    /// Identifies the engine's compilation settings; part of every entry's name and tag.
    engine_key: String,
    key: Arc<KeyFile>,
    /// Whether the directory and the key passed their checks: decided at first use, once
    /// a runtime (a refusal is warned of then, once).
    usable: OnceLock<bool>,
    /// Whether an entry was refused for its owner or mode already: the first such refusal
    /// is a warning, later ones are debug events.
    warned: AtomicBool,
}

/// Feeds a `Hash` value into SHA-256, so the key is stable across processes (std's
/// `DefaultHasher` promises no such thing).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("a SHA-256 digest has 32 bytes"))
    }
}

/// Names everything about `engine` that compiled code depends on (wasmtime's version,
/// its settings, the CPU features), in 16 hex digits.
pub(crate) fn engine_key(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex(&hasher.0.finalize()[..8])
}

impl DiskCache {
    pub(crate) fn new(dir: PathBuf, engine: &Engine, key: Arc<KeyFile>, max_size: u64) -> Self {
        DiskCache {
            dir,
            max_size,
            engine_key: engine_key(engine),
            key,
            usable: OnceLock::new(),
            warned: AtomicBool::new(false),
        }
    }

    /// The file of `digest`'s entry, whether it exists or not.
    pub(crate) fn entry(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}-{}.cwasm", hex(digest), self.engine_key))
    }

    /// Whether the directory (created if missing) and the key are fit for use: the cache
    /// is read and written only if they are.
    pub(crate) fn is_usable(&self) -> bool {
        self.key().is_some()
    }

    /// Whether an entry for `digest` is there to be read: a regular file under its name
    /// (not read, so not yet checked), in a usable directory.
    pub(crate) fn has_entry(&self, digest: &Digest) -> bool {
        self.is_usable() && fs::symlink_metadata(self.entry(digest)).is_ok_and(|meta| meta.is_file())
    }

    /// The key, if the directory (created if missing) and the key are fit for use.
    fn key(&self) -> Option<&Key> {
        let usable = *self.usable.get_or_init(|| {
            let checked = owned::create_dir(&self.dir)
                .map_err(|refused| anyhow::anyhow!("{refused}"))
                .and_then(|()| self.key.get().map(|_| ()));
            match checked {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "not using the compiled-code cache `{}`, compiling instead: {e:#}",
                        self.dir.display()
                    );
                    false
                }
            }
        });
        if usable { self.key.get().ok() } else { None }
    }

    /// The compiled code for `digest`, if an entry exists that passes every check of the
    /// module docs. A refused entry is logged, to be replaced by the caller's compile.
    pub(crate) fn read(&self, engine: &Engine, digest: &Digest) -> Option<Compiled> {
        let key = self.key()?;
        let path = self.entry(digest);
        let bytes = match owned::read(&path, Access::Shared, MAX_ENTRY) {
            Ok(bytes) => bytes,
            Err(Refused::Missing) => return None,
            Err(Refused::Untrusted(why)) => {
                if self.warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!("ignoring cache entry: {why}");
                } else {
                    tracing::warn!("ignoring a compiled-code cache entry, compiling instead: {why}");
                }
                return None;
            }
            Err(Refused::Unusable(why)) => {
                tracing::warn!("ignoring a compiled-code cache entry, compiling instead: {why}");
                return None;
            }
        };
        match self.check(engine, key, digest, &bytes) {
            Ok(component) => {
                tracing::debug!(entry = %path.display(), "loaded compiled code from the cache");
                mark_used(&path);
                Some(component)
            }
            // An entry of an older layout is replaced quietly: that is what an upgrade does.
            Err(_) if bytes.starts_with(&MAGIC[..6]) && !bytes.starts_with(MAGIC) => {
                tracing::debug!("replacing cache entry `{}` of an older layout", path.display());
                None
            }
            Err(e) => {
                tracing::warn!("recompiling: cache entry `{}` is unusable: {e:#}", path.display());
                None
            }
        }
    }

    fn check(&self, engine: &Engine, key: &Key, digest: &Digest, bytes: &[u8]) -> anyhow::Result<Compiled> {
        let rest = bytes.strip_prefix(MAGIC.as_slice()).context("not a wasmproc cache file")?;
        let (kind, _, rest) = split_header(rest).with_context(|| format!("truncated: {} bytes", bytes.len()))?;
        anyhow::ensure!(rest.len() > TAG_LEN, "truncated: {} bytes", bytes.len());
        let (tag, serialized) = rest.split_at(TAG_LEN);
        anyhow::ensure!(
            key.verify(&self.tag_parts(digest, kind, serialized), tag),
            "its tag does not verify: it was not written by this user's wasmproc for this module and \
             engine, or it was altered since"
        );
        // SAFETY: `Compiled::deserialize` requires bytes that `Compiled::serialize`
        // produced for `kind`, unaltered; loading anything else is undefined behaviour.
        // These are, because the tag just verified (in constant time) under this user's key:
        // 1. only `DiskCache::write` makes tags with `TAG_LABEL`, over the kind byte and
        //    the bytes straight from `Compiled::serialize`, and it writes them unchanged;
        // 2. the key is readable by this user only (`key.rs` refuses it otherwise), and
        //    HMAC-SHA256 cannot be computed without it: whoever can merely write the cache
        //    directory cannot make a tag that passes, whether by forging code, recomputing
        //    a checksum, or copying another module's entry (the tag covers `digest`);
        // 3. the tag covers the engine key, and wasmtime checks its own version and
        //    settings header again on deserialize, so code for another engine is refused.
        // What remains is someone who can read this user's key: this user, or root, who
        // can run native code as this user anyway.
        unsafe { Compiled::deserialize(engine, kind, serialized) }
    }

    /// What an entry's tag covers, after the label: the module, the engine, the kind, the
    /// code.
    fn tag_parts<'a>(&'a self, digest: &'a Digest, kind: u8, serialized: &'a [u8]) -> [&'a [u8]; 5] {
        let kind: &'static [u8] = match kind {
            b'c' => b"c",
            b'm' => b"m",
            _ => b"?",
        };
        [TAG_LABEL, digest, self.engine_key.as_bytes(), kind, serialized]
    }

    /// Stores `compiled` for `digest`, compiled from the file its loader calls `source`,
    /// logging (and otherwise ignoring) a failure. Nothing is written into a directory
    /// that failed its checks.
    pub(crate) fn write(&self, digest: &Digest, compiled: &Compiled, source: Option<&str>) {
        let Some(key) = self.key() else { return };
        match self.try_write(key, digest, compiled, source.unwrap_or_default()) {
            Ok(()) => {
                let entry = self.entry(digest);
                tracing::debug!(entry = %entry.display(), "cached the compiled code");
                match evict(&self.dir, self.max_size, Some(&entry)) {
                    Ok(evicted) if evicted.removed > 0 => tracing::debug!(
                        removed = evicted.removed,
                        bytes = evicted.freed,
                        max_size = self.max_size,
                        "evicted the least recently used cache entries"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("could not keep the compiled-code cache `{}` to size: {e:#}", self.dir.display())
                    }
                }
            }
            Err(e) => tracing::warn!("could not cache compiled code in `{}`: {e:#}", self.dir.display()),
        }
    }

    fn try_write(&self, key: &Key, digest: &Digest, compiled: &Compiled, source: &str) -> anyhow::Result<()> {
        let source = &source.as_bytes()[..floor_char_boundary(source, MAX_SOURCE)];
        let serialized = compiled.serialize()?;
        let kind = compiled.kind_byte();
        let tag = key.tag(&self.tag_parts(digest, kind, &serialized));
        let path = self.entry(digest);
        let temp = temp_path(&path);
        let written = (|| -> std::io::Result<()> {
            let mut file = owned::create_new(&temp)?;
            file.write_all(MAGIC)?;
            file.write_all(&[kind])?;
            // At most `MAX_SOURCE` bytes: fits a u16.
            file.write_all(&(source.len() as u16).to_le_bytes())?;
            file.write_all(source)?;
            file.write_all(&tag)?;
            file.write_all(&serialized)?;
            file.sync_all()?;
            fs::rename(&temp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written.with_context(|| format!("failed to write `{}`", path.display()))
    }
}

/// Records a use of the entry at `path`: its access time, now (see the module docs,
/// "Size"). Not through a symlink; a failure only makes the entry look older.
fn mark_used(path: &Path) {
    use rustix::fs::{AtFlags, CWD, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
    let times = Timestamps {
        last_access: Timespec { tv_sec: 0, tv_nsec: UTIME_NOW },
        last_modification: Timespec { tv_sec: 0, tv_nsec: UTIME_OMIT },
    };
    if let Err(e) = rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW) {
        tracing::debug!(entry = %path.display(), error = %e, "could not record the use of a cache entry");
    }
}

/// How old a temporary file of a write must be before it counts as left by an
/// interrupted one: writes take seconds at most. Picked with a wide margin.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// One entry of the disk cache, as [`CompiledCache::entries`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheEntry {
    /// Its file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// When it was written (its modification time).
    pub written: SystemTime,
    /// When it was last loaded (its access time), or written if later.
    pub used: SystemTime,
    /// The file its module was compiled from, as the loader that compiled it named it
    /// (`wasmproc` names the path it was given); `None` if it named none. Read only by
    /// [`CompiledCache::entries`].
    pub source: Option<String>,
}

/// What a removal of entries did; see [`CompiledCache::clean`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Evicted {
    /// Entries removed.
    pub removed: usize,
    /// Their bytes.
    pub freed: u64,
    /// Entries left.
    pub kept: usize,
    /// Their bytes.
    pub kept_bytes: u64,
}

/// Whether `name` is an entry's: `<64 hex digits>-<16 hex digits>.cwasm`, as
/// [`DiskCache::entry`] names them.
fn is_entry_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".cwasm") else { return false };
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    stem.split_once('-').is_some_and(|(module, engine)| hex(module, 64) && hex(engine, 16))
}

/// Whether `name` is a temporary file of a write ([`temp_path`] of an entry).
fn is_temp_name(name: &str) -> bool {
    name.ends_with(".tmp")
        && name.split_once(".cwasm.").is_some_and(|(entry, _)| is_entry_name(&format!("{entry}.cwasm")))
}

/// The entries in `dir`, least recently used first, and the stale temporary files: only
/// regular files of this user's under those names. `dir` is not checked here.
fn scan(dir: &Path) -> anyhow::Result<(Vec<CacheEntry>, Vec<PathBuf>)> {
    let mut entries = Vec::new();
    let mut stale = Vec::new();
    let now = SystemTime::now();
    let listing = match fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((entries, stale)),
        Err(e) => return Err(e).with_context(|| format!("cannot list `{}`", dir.display())),
    };
    for item in listing {
        let item = item.with_context(|| format!("cannot list `{}`", dir.display()))?;
        let name = item.file_name();
        let Some(name) = name.to_str() else { continue };
        let (entry, temp) = (is_entry_name(name), is_temp_name(name));
        if !entry && !temp {
            continue;
        }
        // `lstat`: a symlink under an entry's name is no entry (and is never followed).
        let Ok(meta) = fs::symlink_metadata(item.path()) else { continue };
        if !meta.file_type().is_file() || meta.uid() != owned::euid() {
            continue;
        }
        let written = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if temp {
            if now.duration_since(written).is_ok_and(|age| age > STALE_TEMP) {
                stale.push(item.path());
            }
            continue;
        }
        let used = meta.accessed().unwrap_or(written).max(written);
        entries.push(CacheEntry { path: item.path(), size: meta.len(), written, used, source: None });
    }
    entries.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.path.cmp(&b.path)));
    Ok((entries, stale))
}

/// Removes the least recently used entries of `dir` until the rest take at most
/// `max_size` bytes, never `keep`; and the stale temporary files. An entry already gone
/// (another host removed it) counts as removed by no one.
fn evict(dir: &Path, max_size: u64, keep: Option<&Path>) -> anyhow::Result<Evicted> {
    let (entries, stale) = scan(dir)?;
    for temp in stale {
        let _ = fs::remove_file(temp);
    }
    let mut total: u64 = entries.iter().map(|e| e.size).sum();
    let mut evicted = Evicted::default();
    for entry in entries {
        if total > max_size && keep != Some(entry.path.as_path()) {
            match fs::remove_file(&entry.path) {
                Ok(()) => {
                    evicted.removed += 1;
                    evicted.freed += entry.size;
                    total -= entry.size;
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    total -= entry.size;
                    continue;
                }
                Err(e) => return Err(e).with_context(|| format!("cannot remove `{}`", entry.path.display())),
            }
        }
        evicted.kept += 1;
        evicted.kept_bytes += entry.size;
    }
    Ok(evicted)
}

/// The disk cache of compiled code as its user manages it: what `wasmproc cache ls` and
/// `wasmproc cache clean` list and remove. The directory must pass the checks a runtime
/// makes before using it (this user's, writable by no one else); only entries are listed
/// or removed (see the module docs, "Size").
#[derive(Debug, Clone)]
pub struct CompiledCache {
    dir: PathBuf,
}

impl CompiledCache {
    /// The cache a runtime with `config` uses, or `None` if it uses none
    /// ([`Config::no_disk_cache`], or no home directory to put it in).
    pub fn of(config: &Config) -> Option<CompiledCache> {
        config.resolved_cache_dir().map(|dir| CompiledCache { dir })
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its entries, least recently used first. A directory not made yet has none.
    ///
    /// # Errors
    ///
    /// The directory is not this user's or others may write it (the error says what to
    /// do), or it cannot be listed.
    pub fn entries(&self) -> anyhow::Result<Vec<CacheEntry>> {
        self.check()?;
        let mut entries = scan(&self.dir)?.0;
        for entry in &mut entries {
            entry.source = read_source(&entry.path);
        }
        Ok(entries)
    }

    /// Removes the least recently used entries until the rest take at most `max_size`
    /// bytes (`0`: all of them), and the temporary files interrupted writes left.
    ///
    /// # Errors
    ///
    /// As [`CompiledCache::entries`], or an entry that cannot be removed (what was
    /// removed before it stays removed).
    pub fn clean(&self, max_size: u64) -> anyhow::Result<Evicted> {
        self.check()?;
        evict(&self.dir, max_size, None)
    }

    fn check(&self) -> anyhow::Result<()> {
        match owned::check_dir(&self.dir) {
            Ok(()) | Err(Refused::Missing) => Ok(()),
            Err(refused) => bail!("not touching the compiled-code cache `{}`: {refused}", self.dir.display()),
        }
    }
}

/// The kind byte, the source name and the rest of an entry past its `MAGIC`; `None` if
/// it ends before them.
fn split_header(rest: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&kind, rest) = rest.split_first()?;
    let (length, rest) = rest.split_first_chunk::<2>()?;
    let length = usize::from(u16::from_le_bytes(*length));
    (rest.len() >= length).then(|| (kind, &rest[..length], &rest[length..]))
}

/// The source name in the header of the entry at `path`: `None` if it has none, is of
/// another layout, or cannot be read. Reads the header only, not through a symlink, and
/// without changing the entry's access time, which is its last use (`O_NOATIME`, which
/// the entry's owner, this user, may ask for).
fn read_source(path: &Path) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(
            (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOATIME).bits() as i32,
        )
        .open(path)
        .ok()?;
    let mut header = Vec::with_capacity(MAGIC.len() + 3 + MAX_SOURCE);
    file.take((MAGIC.len() + 3 + MAX_SOURCE) as u64).read_to_end(&mut header).ok()?;
    let (_, source, _) = split_header(header.strip_prefix(MAGIC.as_slice())?)?;
    let source = std::str::from_utf8(source).ok()?;
    (!source.is_empty()).then(|| source.to_owned())
}

/// The largest index of at most `at` that is a character boundary of `text`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// A name beside `path` that no other writer uses at the same time.
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::time::Duration;

    use super::*;
    use crate::wasm::{Config, Inspection, Runtime};

    /// Two modules told apart by their one export.
    const A: &str = r#"(module (func (export "a") (result i32) (i32.const 1)))"#;
    const B: &str = r#"(module (func (export "b") (result i32) (i32.const 2)))"#;

    /// A cache directory of the test's own, fresh.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wasmproc-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A runtime with its cache (and key) in `dir`, as a new run of the host has.
    fn runtime(dir: &Path) -> Runtime {
        Runtime::new(Config::default().cache_dir(dir).max_instances(1)).expect("the runtime starts")
    }

    fn inspect(dir: &Path, wat: &str) -> Inspection {
        runtime(dir).inspect(&wat::parse_str(wat).unwrap()).expect("the module compiles")
    }

    /// Inspects `wat` in a new runtime of `dir` and asserts that its code was compiled
    /// afresh (not loaded from the cache) and is that module's.
    #[track_caller]
    fn assert_compiled_afresh(dir: &Path, wat: &str, export: &str) {
        let found = inspect(dir, wat);
        assert!(!found.cached, "the entry was loaded: {found:?}");
        assert_eq!(found.exports, [export], "the code of another module ran");
    }

    #[test]
    fn entries_are_written_and_read_back() {
        let dir = scratch("roundtrip");
        assert!(!inspect(&dir, A).cached);
        let found = inspect(&dir, A);
        assert!(found.cached, "{found:?}");
        assert_eq!(found.exports, ["a"]);
        let _ = fs::remove_dir_all(&dir);
    }

    /// A forged entry: one of the right layout whose code was replaced (here with another
    /// module's, so that the test can tell which ran) and whose integrity field was
    /// recomputed without the key (here as a SHA-256, as any unkeyed checksum could be).
    /// A checksum would pass it; the tag does not.
    #[test]
    fn a_forged_entry_is_refused_and_the_module_compiled() {
        let dir = scratch("forged");
        let a = inspect(&dir, A).cache_entry.unwrap();
        let b = inspect(&dir, B).cache_entry.unwrap();
        let a_bytes = fs::read(&a).unwrap();
        let code = &a_bytes[MAGIC.len() + 3 + TAG_LEN..];
        let mut forged = MAGIC.to_vec();
        forged.extend_from_slice(&[b'm', 0, 0]);
        forged.extend_from_slice(&digest(code));
        forged.extend_from_slice(code);
        fs::write(&b, &forged).unwrap();
        assert_compiled_afresh(&dir, B, "b");
        // The compile replaced the forgery with a good entry.
        assert!(inspect(&dir, B).cached);
        let _ = fs::remove_dir_all(&dir);
    }

    /// A's genuine entry, tag and all, under B's name: the tag covers the module's digest.
    #[test]
    fn an_entry_copied_over_another_modules_name_is_refused() {
        let dir = scratch("copied");
        let a = inspect(&dir, A).cache_entry.unwrap();
        let b = inspect(&dir, B).cache_entry.unwrap();
        fs::copy(&a, &b).unwrap();
        assert_compiled_afresh(&dir, B, "b");
        let _ = fs::remove_dir_all(&dir);
    }

    /// An entry made with another key (another user's, with the same module and engine).
    #[test]
    fn an_entry_tagged_with_another_key_is_refused() {
        let dir = scratch("other-key");
        let b = inspect(&dir, B).cache_entry.unwrap();
        let genuine = fs::read(&b).unwrap();
        fs::remove_file(dir.join("key")).unwrap();
        // A new key is made; the old entry no longer verifies.
        assert_compiled_afresh(&dir, B, "b");
        assert_ne!(fs::read(&b).unwrap(), genuine, "the entry was rewritten under the new key");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_entry_of_another_user_or_writable_by_others_is_refused() {
        let dir = scratch("owner");
        let b = inspect(&dir, B).cache_entry.unwrap();
        fs::set_permissions(&b, fs::Permissions::from_mode(0o666)).unwrap();
        assert_compiled_afresh(&dir, B, "b");
        // Only root can give a file away; without root the ownership check is covered in
        // `owned.rs` alone.
        if owned::euid() == 0 {
            std::os::unix::fs::chown(&b, Some(65534), Some(65534)).unwrap();
            assert_compiled_afresh(&dir, B, "b");
        }
        let _ = fs::remove_dir_all(&dir);
    }

    /// A directory others may write is neither read nor written.
    #[test]
    fn a_cache_directory_writable_by_others_is_not_used() {
        let dir = scratch("open-dir");
        let b = inspect(&dir, B).cache_entry.unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert_compiled_afresh(&dir, B, "b");
        fs::remove_file(&b).unwrap();
        assert_compiled_afresh(&dir, B, "b");
        assert!(!b.exists(), "nothing is written into the directory");
        let _ = fs::remove_dir_all(&dir);
    }

    /// A FIFO or a symlink in an entry's place is not opened in a way that blocks (no one
    /// will ever write the FIFO) and not followed.
    #[test]
    fn a_fifo_or_symlink_entry_is_skipped_without_blocking() {
        let dir = scratch("fifo");
        let b = inspect(&dir, B).cache_entry.unwrap();
        fs::remove_file(&b).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &b,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let inspecting = dir.clone();
        std::thread::spawn(move || {
            let _ = tx.send(inspect(&inspecting, B));
        });
        let found = rx.recv_timeout(Duration::from_secs(60)).expect("the FIFO blocked the load");
        assert!(!found.cached && found.exports == ["b"], "{found:?}");

        // A symlink to a genuine entry (of this very module) is not followed either.
        let elsewhere = dir.join("elsewhere");
        fs::rename(&b, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &b).unwrap();
        assert_compiled_afresh(&dir, B, "b");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn digests_are_hex_sha256() {
        assert_eq!(hex(&digest(b"abc"))[..16], *"ba7816bf8f01cfea");
    }

    #[test]
    fn only_entries_and_their_temporary_files_are_recognised() {
        let entry = format!("{}-{}.cwasm", "ab".repeat(32), "0".repeat(16));
        assert!(is_entry_name(&entry));
        let temp = temp_path(Path::new(&entry));
        assert!(is_temp_name(temp.to_str().unwrap()), "{temp:?}");
        for other in ["key", "cache.key", "notes.cwasm", "x.tmp", &format!("{entry}.bak"), &entry[1..]] {
            assert!(!is_entry_name(other) && !is_temp_name(other), "{other}");
        }
    }

    #[test]
    fn temp_names_are_distinct_and_beside_the_entry() {
        let entry = Path::new("/cache/abc.cwasm");
        let (a, b) = (temp_path(entry), temp_path(entry));
        assert_ne!(a, b);
        assert_eq!(a.parent(), entry.parent());
    }
}
