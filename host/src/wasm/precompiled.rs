//! Files made by `wasmproc compile` ([`Runtime::precompile`](super::Runtime::precompile)):
//! compiled code that a later run loads instead of compiling.
//!
//! Layout: [`MAGIC`], one line of JSON saying how the code was made (a [`Header`]), the
//! SHA-256 of the code, a tag, then wasmtime's serialization of the component or module
//! (the code). The header is compared with the loading runtime before anything is
//! deserialized, so a mismatch is reported by what differs (wasmproc's version, fuel
//! metering, or the wasmtime build and CPU) with what to do about it, instead of as
//! wasmtime's generic refusal; the checksum refuses a damaged file.
//!
//! # Trust
//!
//! A precompiled file is native code, loaded into the host. The tag is an HMAC-SHA256,
//! under the compiling user's secret key (`key.rs`, the key of the disk cache), of the
//! header line and the code: a file that verifies was made by this user's
//! `wasmproc compile` and not altered since, so it is loaded as a cache entry would be.
//! Any other file, made by another user, on another machine, or altered with its
//! checksum recomputed, is refused, with an error that names the way to load it anyway:
//! [`Config::trust_precompiled`] (`--trust-precompiled`), which loads the code on its
//! checksum alone and so trusts whoever made the file as one trusts a binary. The
//! checksum is checked first either way, so a damaged file is reported as damaged.

use anyhow::{Context as _, bail, ensure};
use serde::{Deserialize, Serialize};
use wasmtime::Engine;

use super::cache::{self, Compiled};
use super::config::Config;
use super::key::{KeyFile, TAG_LEN};

/// The first bytes of a precompiled file. It begins with a NUL so that no text file and
/// no Wasm binary (`\0asm`) can be taken for one.
const MAGIC: &[u8] = b"\0wasmproc-precompiled\n";

/// The first bytes of an ELF file: a native program, or a file wasmtime itself
/// precompiled (`wasmtime compile`), which wasmproc does not load because nothing vouches
/// for its settings or its maker.
pub(crate) const ELF: &[u8] = b"\x7fELF";

/// What the first part of a file's tag says it is: no cache entry's tag (which names
/// itself otherwise) can pass for a precompiled file's.
const TAG_LABEL: &[u8] = b"wasmproc precompiled file";

/// How a precompiled file was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    /// The layout of the file; bump it when it changes.
    format: u32,
    /// The wasmproc version that compiled it.
    wasmproc: String,
    /// [`cache::engine_key`] of the compiling engine: wasmtime's version, settings and
    /// the CPU features the code may use.
    engine: String,
    /// `"component"` or `"module"`.
    kind: String,
    /// The memory cap (`Config::max_memory`) of the compiling runtime: for information
    /// only, since bounds checks are against each memory's current size, not the cap.
    max_memory: usize,
    /// Whether the code meters fuel (`Config::fuel`).
    fuel: bool,
    /// The SHA-256 of the Wasm it was compiled from, in hex.
    source_sha256: String,
}

/// Format 2 added the tag.
const FORMAT: u32 = 2;

/// Whether `bytes` start like a precompiled file (of wasmproc's or of wasmtime's).
pub(crate) fn is_precompiled(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC) || bytes.starts_with(ELF)
}

/// The precompiled file of `compiled`, made by `engine` under `config` from `source`, with
/// the tag of `key`.
///
/// # Errors
///
/// This user's key cannot be read or created, or the code cannot be serialized.
pub(crate) fn write(
    engine: &Engine,
    config: &Config,
    key: &KeyFile,
    compiled: &Compiled,
    source: &[u8],
) -> anyhow::Result<Vec<u8>> {
    let key = key.get().context("cannot sign the precompiled file with this user's key")?;
    let header = Header {
        format: FORMAT,
        wasmproc: env!("CARGO_PKG_VERSION").to_owned(),
        engine: cache::engine_key(engine),
        kind: kind_name(compiled.kind_byte()).to_owned(),
        max_memory: config.max_memory,
        fuel: config.fuel.is_some(),
        source_sha256: crate::codec::hex(&cache::digest(source)),
    };
    let serialized = compiled.serialize()?;
    let line = serde_json::to_vec(&header).context("failed to write the header")?;
    let mut file = MAGIC.to_vec();
    file.extend_from_slice(&line);
    file.push(b'\n');
    file.extend_from_slice(&cache::digest(&serialized));
    file.extend_from_slice(&key.tag(&[TAG_LABEL, &line, &serialized]));
    file.extend_from_slice(&serialized);
    Ok(file)
}

/// Loads a precompiled file into `engine`, or says why it cannot be loaded here.
pub(crate) fn read(engine: &Engine, config: &Config, key: &KeyFile, bytes: &[u8]) -> anyhow::Result<Compiled> {
    if bytes.starts_with(ELF) {
        bail!(
            "this is an ELF file (a native program, or code precompiled by `wasmtime compile`), which \
             wasmproc does not load: give `wasmproc` the .wasm file, or precompile it with `wasmproc compile`"
        );
    }
    let rest = bytes.strip_prefix(MAGIC).context("not a file made by `wasmproc compile`")?;
    let line_end = rest.iter().position(|&b| b == b'\n').context("the precompiled file is truncated")?;
    let line = &rest[..line_end];
    let header: Header = serde_json::from_slice(line).context("the precompiled file's header is damaged")?;
    check(&header, engine, config)?;
    let rest = &rest[line_end + 1..];
    ensure!(rest.len() > 32 + TAG_LEN, "the precompiled file is truncated");
    let (sum, rest) = rest.split_at(32);
    let (tag, serialized) = rest.split_at(TAG_LEN);
    ensure!(
        cache::digest(serialized).as_slice() == sum,
        "the precompiled file is damaged (checksum mismatch): compile it again with `wasmproc compile`"
    );
    if !config.trust_precompiled {
        let trust = "it is native code, so wasmproc loads it only with `--trust-precompiled` \
                     (`Config::trust_precompiled`) if you trust its source as you would a binary's; \
                     or compile the .wasm file again with `wasmproc compile`";
        let key = key.get().with_context(|| format!("cannot check who made the precompiled file: {trust}"))?;
        ensure!(
            key.verify(&[TAG_LABEL, line, serialized], tag),
            "the precompiled file was not made with this user's key (it was compiled by another user \
             or on another machine, or altered since): {trust}"
        );
    }
    let kind = match header.kind.as_str() {
        "component" => b'c',
        "module" => b'm',
        other => bail!("the precompiled file holds an unknown kind of code `{other}`"),
    };
    // SAFETY: `Compiled::deserialize` needs bytes that `Compiled::serialize` produced for
    // `kind`, unaltered. Either:
    // 1. the tag verified (in constant time) under this user's key, which only this user
    //    can read: only `write` makes tags with `TAG_LABEL`, over the header line (which
    //    names the kind) and the bytes straight from `Compiled::serialize`, so the file
    //    was made by this user's `wasmproc compile` and is unaltered; or
    // 2. the runtime was told to trust precompiled files (`Config::trust_precompiled`,
    //    an `unsafe` setting whose caller vouches for every file it loads, as for a
    //    binary it runs); the checksum shows the code is what its maker stored.
    // Either way the header's engine key matches this engine, and wasmtime checks its own
    // version and settings header again.
    unsafe { Compiled::deserialize(engine, kind, serialized) }
        .context("wasmtime refused the precompiled code: compile it again with `wasmproc compile`")
}

/// Refuses a file made under other settings, naming the first that differs.
fn check(header: &Header, engine: &Engine, config: &Config) -> anyhow::Result<()> {
    let ours = env!("CARGO_PKG_VERSION");
    ensure!(
        header.format == FORMAT && header.wasmproc == ours,
        "the file was precompiled by wasmproc {} (file format {}); this is wasmproc {ours} (file format \
         {FORMAT}): compile it again with this `wasmproc compile`",
        header.wasmproc,
        header.format
    );
    ensure!(
        header.fuel == config.fuel.is_some(),
        "the file was precompiled {} fuel metering, but this run {} it: compile it again {} `--fuel`",
        if header.fuel { "with" } else { "without" },
        if header.fuel { "does not use" } else { "uses" },
        if config.fuel.is_some() { "with" } else { "without" },
    );
    ensure!(
        header.engine == cache::engine_key(engine),
        "the file was precompiled for another CPU or another build of the engine: \
         compile it again with `wasmproc compile` on this machine"
    );
    Ok(())
}

fn kind_name(kind: u8) -> &'static str {
    if kind == b'm' { "module" } else { "component" }
}

/// The header of a precompiled file, for `inspect`: `None` if it is not one of ours.
pub(crate) fn header(bytes: &[u8]) -> Option<Header> {
    let rest = bytes.strip_prefix(MAGIC)?;
    let line_end = rest.iter().position(|&b| b == b'\n')?;
    serde_json::from_slice(&rest[..line_end]).ok()
}

impl Header {
    /// The SHA-256 of the Wasm the file was compiled from, in hex.
    pub(crate) fn source_sha256(&self) -> &str {
        &self.source_sha256
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use sha2::{Digest as _, Sha256};

    use crate::wasm::{Config, Runtime};

    const MODULE: &str = r#"(module (func (export "_start")))"#;

    /// A runtime whose key is in a directory of its own: `name` stands for a user.
    fn runtime(name: &str, trust: bool) -> Runtime {
        let dir: PathBuf = std::env::temp_dir().join(format!("wasmproc-precompiled-{name}-{}", std::process::id()));
        let mut config = Config::default().cache_dir(dir).max_instances(1);
        if trust {
            // SAFETY: the files this runtime loads are the test's own.
            config = unsafe { config.trust_precompiled(true) };
        }
        Runtime::new(config).expect("the runtime starts")
    }

    fn load(runtime: &Runtime, file: &[u8]) -> Result<(), String> {
        runtime.inspect(file).map(|_| ()).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn a_file_loads_for_its_maker_and_for_others_only_when_trusted() {
        let file = runtime("maker", false).precompile(&wat::parse_str(MODULE).unwrap()).unwrap();
        load(&runtime("maker", false), &file).unwrap();
        let error = load(&runtime("other", false), &file).unwrap_err();
        assert!(error.contains("not made with this user's key") && error.contains("`--trust-precompiled`"), "{error}");
        load(&runtime("other", true), &file).unwrap();
    }

    /// Code replaced and the checksum recomputed: the checksum passes, the tag does not.
    #[test]
    fn altered_code_with_a_recomputed_checksum_is_refused() {
        let maker = runtime("alter", false);
        let mut file = maker.precompile(&wat::parse_str(MODULE).unwrap()).unwrap();
        let code_start = find_code(&file);
        let last = file.len() - 1;
        file[last] ^= 1;
        let sum: [u8; 32] = Sha256::digest(&file[code_start..]).into();
        file[code_start - 64..code_start - 32].copy_from_slice(&sum);
        let error = load(&maker, &file).unwrap_err();
        assert!(error.contains("not made with this user's key"), "{error}");
        // A damaged file (checksum not recomputed) is reported as damaged.
        file[last] ^= 2;
        let error = load(&maker, &file).unwrap_err();
        assert!(error.contains("damaged (checksum mismatch)"), "{error}");
    }

    /// Where the code starts: after the magic, the header line, the checksum and the tag.
    fn find_code(file: &[u8]) -> usize {
        let line_end = file[super::MAGIC.len()..].iter().position(|&b| b == b'\n').unwrap();
        super::MAGIC.len() + line_end + 1 + 32 + super::TAG_LEN
    }

    #[test]
    fn elf_files_and_precompiled_files_are_not_compiled_again() {
        let runtime = runtime("elf", false);
        let error = format!("{:#}", runtime.precompile(b"\x7fELF\x02\x01\x01\0rest").unwrap_err());
        assert!(error.contains("this is an ELF file") && error.contains("not a WebAssembly module"), "{error}");
        let file = runtime.precompile(&wat::parse_str(MODULE).unwrap()).unwrap();
        let error = format!("{:#}", runtime.precompile(&file).unwrap_err());
        assert!(error.contains("already precompiled"), "{error}");
    }
}
