//! Files made by `wasmproc compile` ([`Runtime::precompile`](super::Runtime::precompile)):
//! compiled code that a later run loads instead of compiling.
//!
//! Layout: [`MAGIC`], one line of JSON saying how the code was made (a [`Header`]), the
//! SHA-256 of the rest, then wasmtime's serialization of the component or module. The
//! header is compared with the loading runtime before anything is deserialized, so a
//! mismatch is reported by what differs (wasmproc's version, fuel metering, or the
//! wasmtime build and CPU) with what to do about it, instead of as
//! wasmtime's generic refusal; the checksum refuses a damaged file.

use anyhow::{Context as _, bail, ensure};
use serde::{Deserialize, Serialize};
use wasmtime::Engine;

use super::cache::{self, Compiled};
use super::config::Config;

/// The first bytes of a precompiled file. It begins with a NUL so that no text file and
/// no Wasm binary (`\0asm`) can be taken for one.
const MAGIC: &[u8] = b"\0wasmproc-precompiled\n";

/// The first bytes of a file wasmtime itself precompiled (`wasmtime compile`): an ELF
/// object, which wasmproc does not load because nothing vouches for its settings.
const ELF: &[u8] = b"\x7fELF";

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

const FORMAT: u32 = 1;

/// Whether `bytes` start like a precompiled file (of wasmproc's or of wasmtime's).
pub(crate) fn is_precompiled(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC) || bytes.starts_with(ELF)
}

/// The precompiled file of `compiled`, made by `engine` under `config` from `source`.
pub(crate) fn write(engine: &Engine, config: &Config, compiled: &Compiled, source: &[u8]) -> anyhow::Result<Vec<u8>> {
    let header = Header {
        format: FORMAT,
        wasmproc: env!("CARGO_PKG_VERSION").to_owned(),
        engine: cache::engine_key(engine),
        kind: kind_name(compiled.kind_byte()).to_owned(),
        max_memory: config.max_memory,
        fuel: config.fuel.is_some(),
        source_sha256: cache::hex(&cache::digest(source)),
    };
    let serialized = compiled.serialize()?;
    let mut file = MAGIC.to_vec();
    serde_json::to_writer(&mut file, &header).context("failed to write the header")?;
    file.push(b'\n');
    file.extend_from_slice(&cache::digest(&serialized));
    file.extend_from_slice(&serialized);
    Ok(file)
}

/// Loads a precompiled file into `engine`, or says why it cannot be loaded here.
pub(crate) fn read(engine: &Engine, config: &Config, bytes: &[u8]) -> anyhow::Result<Compiled> {
    if bytes.starts_with(ELF) {
        bail!(
            "this is code precompiled by `wasmtime compile`, which wasmproc does not load: \
             give `wasmproc` the .wasm file, or precompile it with `wasmproc compile`"
        );
    }
    let rest = bytes.strip_prefix(MAGIC).context("not a file made by `wasmproc compile`")?;
    let line_end = rest.iter().position(|&b| b == b'\n').context("the precompiled file is truncated")?;
    let header: Header =
        serde_json::from_slice(&rest[..line_end]).context("the precompiled file's header is damaged")?;
    check(&header, engine, config)?;
    let rest = &rest[line_end + 1..];
    ensure!(rest.len() > 32, "the precompiled file is truncated");
    let (sum, serialized) = rest.split_at(32);
    ensure!(
        cache::digest(serialized).as_slice() == sum,
        "the precompiled file is damaged (checksum mismatch): compile it again with `wasmproc compile`"
    );
    let kind = match header.kind.as_str() {
        "component" => b'c',
        "module" => b'm',
        other => bail!("the precompiled file holds an unknown kind of code `{other}`"),
    };
    // SAFETY: `Compiled::deserialize` needs bytes that `Compiled::serialize` produced for
    // `kind`, unaltered. The file starts with wasmproc's magic and a header that
    // `write` made, the checksum shows the serialization is the one `write` stored
    // after it, and the header's engine key matches this engine (wasmtime checks its
    // own version and settings again). Loading a precompiled file still trusts whoever
    // wrote it, as running any native code does: the CLI documents this.
    unsafe { Compiled::deserialize(engine, kind, serialized) }
        .context("wasmtime refused the precompiled code: compile it again with `wasmproc compile`")
}

/// Refuses a file made under other settings, naming the first that differs.
fn check(header: &Header, engine: &Engine, config: &Config) -> anyhow::Result<()> {
    let ours = env!("CARGO_PKG_VERSION");
    ensure!(
        header.format == FORMAT && header.wasmproc == ours,
        "the file was precompiled by wasmproc {} (file format {}); this is wasmproc {ours}: \
         compile it again with this `wasmproc compile`",
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
