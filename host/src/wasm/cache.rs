//! Compile once: the disk cache of compiled components.
//!
//! An entry is named by the SHA-256 of the component's bytes and by a hash of everything
//! about the engine that compiled code depends on (wasmtime's version, its settings, the
//! CPU features), so a module is found again whatever its path, and an upgrade or a new
//! setting simply misses. Each file is `MAGIC`, the kind of artefact (component or core
//! module), the SHA-256 of the rest, then wasmtime's serialization of it: a torn or
//! corrupted file fails the checksum and is compiled again, never loaded.
//!
//! Writes go to a temporary file that is renamed into place, so readers never see a
//! partial entry, and two hosts compiling the same module at once both succeed (the last
//! rename wins; both files are equally good). Every cache failure is logged and
//! otherwise ignored: the cache makes loading faster, never fails it.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Module};

/// The first bytes of a cache file; bump the digit when the layout changes.
const MAGIC: &[u8; 8] = b"wasmpc2\n";

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

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiled components on disk, for one engine.
pub(crate) struct DiskCache {
    dir: PathBuf,
    /// Identifies the engine's compilation settings; part of every entry's name.
    engine_key: String,
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
    pub(crate) fn new(dir: PathBuf, engine: &Engine) -> Self {
        DiskCache { dir, engine_key: engine_key(engine) }
    }

    /// The file of `digest`'s entry, whether it exists or not.
    pub(crate) fn entry(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}-{}.cwasm", hex(digest), self.engine_key))
    }

    /// The compiled code for `digest`, if a sound entry exists. A bad entry is logged
    /// and removed, to be replaced by the caller's compile.
    pub(crate) fn read(&self, engine: &Engine, digest: &Digest) -> Option<Compiled> {
        let path = self.entry(digest);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                eprintln!("wasmproc: ignoring unreadable cache entry `{}`: {e}", path.display());
                return None;
            }
        };
        match self.check(engine, &bytes) {
            Ok(component) => Some(component),
            // An entry of an older layout is replaced quietly: that is what an upgrade does.
            Err(_) if bytes.starts_with(&MAGIC[..6]) && !bytes.starts_with(MAGIC) => {
                let _ = fs::remove_file(&path);
                None
            }
            Err(e) => {
                eprintln!("wasmproc: recompiling: cache entry `{}` is unusable: {e:#}", path.display());
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    fn check(&self, engine: &Engine, bytes: &[u8]) -> anyhow::Result<Compiled> {
        let rest = bytes.strip_prefix(MAGIC.as_slice()).context("not a wasmproc cache file")?;
        anyhow::ensure!(rest.len() > 32, "truncated: {} bytes", bytes.len());
        let (kind, rest) = (rest[0], &rest[1..]);
        let (sum, serialized) = rest.split_at(32);
        anyhow::ensure!(digest(serialized).as_slice() == sum, "checksum mismatch");
        // SAFETY: `Compiled::deserialize` requires bytes that `Compiled::serialize`
        // produced for `kind`, unaltered; loading anything else is undefined behaviour.
        // These are:
        // 1. only this module writes files of this name and layout, with the kind byte
        //    and the bytes straight from `Compiled::serialize`;
        // 2. the checksum just verified shows the bytes are the ones written, so a torn
        //    write or a corrupted disk block is refused above, not loaded;
        // 3. the entry's name carries the engine's compatibility hash, and wasmtime
        //    checks its own version and settings header again on deserialize.
        // What remains is someone deliberately forging an entry, which needs write
        // access to the user's cache directory: the same trust as the host binary.
        unsafe { Compiled::deserialize(engine, kind, serialized) }
    }

    /// Stores `compiled` for `digest`, logging (and otherwise ignoring) a failure.
    pub(crate) fn write(&self, digest: &Digest, compiled: &Compiled) {
        if let Err(e) = self.try_write(digest, compiled) {
            eprintln!("wasmproc: could not cache compiled code in `{}`: {e:#}", self.dir.display());
        }
    }

    fn try_write(&self, digest: &Digest, compiled: &Compiled) -> anyhow::Result<()> {
        let serialized = compiled.serialize()?;
        fs::create_dir_all(&self.dir).context("failed to create the directory")?;
        let path = self.entry(digest);
        let temp = temp_path(&path);
        let written = (|| -> std::io::Result<()> {
            let mut file = fs::File::create(&temp)?;
            file.write_all(MAGIC)?;
            file.write_all(&[compiled.kind_byte()])?;
            file.write_all(&self::digest(&serialized))?;
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
    use super::*;

    #[test]
    fn digests_are_hex_sha256() {
        assert_eq!(hex(&digest(b"abc"))[..16], *"ba7816bf8f01cfea");
    }

    #[test]
    fn temp_names_are_distinct_and_beside_the_entry() {
        let entry = Path::new("/cache/abc.cwasm");
        let (a, b) = (temp_path(entry), temp_path(entry));
        assert_ne!(a, b);
        assert_eq!(a.parent(), entry.parent());
    }
}
