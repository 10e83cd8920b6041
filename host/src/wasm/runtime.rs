//! [`Runtime`]: the engine, the linkers and the module cache; loading a program
//! ([`Program`]: a [`Component`] or a [`WasiProgram`]), compiling it once, and
//! precompiling it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context as _, bail, ensure};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use wasmtime::Engine;
use wasmtime::component::Linker;

use super::bindings::WORLD;
use super::cache::{self, Compiled, Digest, DiskCache};
use super::component::{self, Component};
use super::config::Config;
use super::engine::{EpochClock, new_engine};
use super::hibernate;
use super::image::{self, GuestImage};
use super::key::KeyFile;
use super::limits;
use super::precompiled;
use super::store::ProcessState;
use super::wasi::{self, Code, WasiLinkers, WasiProgram};

/// Loads and compiles components, and holds what their processes share: the engine
/// (with its memory arena and epoch thread) and the linker. Cheap to clone; build one
/// per host (each runtime reserves its own arena, see [`Config::max_instances`]).
///
/// Loading the same bytes twice, from any path, compiles once: later loads return the
/// first [`Component`]. With a disk cache (the default) a later run of the host loads
/// the compiled code instead of compiling again.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

/// What the clones of a [`Runtime`] share.
struct RuntimeInner {
    engine: Engine,
    clock: EpochClock,
    linker: Linker<ProcessState>,
    config: Config,
    disk: Option<DiskCache>,
    /// This user's key, which authenticates the disk cache and precompiled files.
    key: Arc<KeyFile>,
    /// The linkers of WASI programs, made when the first one is loaded.
    wasi_linkers: OnceLock<WasiLinkers>,
    /// One slot per module: a second loader of a module waits for the first one's
    /// compile instead of compiling it again.
    loaded: Mutex<FxHashMap<Digest, Arc<Mutex<Option<Program>>>>>,
    /// The files modules were read from, as [`Runtime::name_source`] named them: what a
    /// compile of one records in its cache entry.
    sources: Mutex<FxHashMap<Digest, String>>,
    // Counters for `stats` only: they order nothing, so `Relaxed`.
    compiled: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
    /// What its processes' whole-instance hibernations did (`hibernate.rs`).
    hibernation: Arc<hibernate::Counts>,
}

/// What [`Runtime::load`] has done so far; see [`Runtime::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadStats {
    /// Components compiled from Wasm.
    pub compiled: u64,
    /// Components loaded from the disk cache instead.
    pub disk_hits: u64,
    /// Loads answered with a component this runtime had already loaded.
    pub memory_hits: u64,
}

/// What whole-instance hibernation has done; see [`Runtime::hibernation_stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HibernationStats {
    /// Processes hibernated whole now: their instance given back, what makes it again kept.
    pub hibernated: u64,
    /// Times a process was hibernated whole.
    pub hibernations: u64,
    /// Times a hibernated process was made again for its next step.
    pub wakes: u64,
    /// Bytes the processes hibernated now keep of their memories (compressed).
    pub kept_bytes: u64,
}

impl Runtime {
    /// Creates the engine (reserving the memory arena) and starts its epoch thread.
    ///
    /// # Errors
    ///
    /// An out-of-range setting, or an engine or thread that could not be created (for
    /// example: the arena's address-space reservation was refused).
    pub fn new(config: Config) -> anyhow::Result<Runtime> {
        let (engine, clock) = new_engine(&config)?;
        let linker = component::linker(&engine)?;
        let key = Arc::new(KeyFile::new(config.resolved_key_file()));
        let disk =
            config.resolved_cache_dir().map(|dir| DiskCache::new(dir, &engine, key.clone(), config.max_cache_size));
        let inner = RuntimeInner {
            engine,
            clock,
            linker,
            config,
            disk,
            key,
            wasi_linkers: OnceLock::new(),
            loaded: Mutex::default(),
            sources: Mutex::default(),
            compiled: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            hibernation: Arc::default(),
        };
        Ok(Runtime { inner: Arc::new(inner) })
    }

    /// Loads the component in the file at `path`: see [`Runtime::load_bytes`].
    ///
    /// # Errors
    ///
    /// The file cannot be read, or as [`Runtime::load_bytes`]; the error names the path.
    pub fn load(&self, path: impl AsRef<Path>) -> anyhow::Result<Component> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("failed to read `{}`", path.display()))?;
        self.name_source(&bytes, path);
        self.load_bytes(&bytes).with_context(|| format!("failed to load `{}`", path.display()))
    }

    /// Loads a component from its bytes: compiles it (or finds it in the caches), checks
    /// that it fits the `process` world, and asks it for its entry methods. The bytes may
    /// also be a file made by [`Runtime::precompile`], which is loaded without compiling.
    ///
    /// # Errors
    ///
    /// The bytes are not a component (for example a core module), do not compile, import
    /// something the host does not provide, lack one of the world's exports (the error
    /// names it), are a WASI command instead (see [`Runtime::load_program_bytes`]), or
    /// trap in `entries`.
    pub fn load_bytes(&self, bytes: &[u8]) -> anyhow::Result<Component> {
        if !precompiled::is_precompiled(bytes) {
            check_header(bytes)?;
        }
        match self.load_program_bytes(bytes)? {
            Program::Process(component) => Ok(component),
            Program::Wasi(_) => bail!(
                "this is a WASI command (it exports `wasi:cli/run` or `_start`), not a component of the \
                 `{WORLD}` world: run it as a command (`Runtime::load_program`, or `wasmproc run`)"
            ),
        }
    }

    /// Loads the program in the file at `path`: see [`Runtime::load_program_bytes`].
    ///
    /// # Errors
    ///
    /// The file cannot be read, or as [`Runtime::load_program_bytes`]; the error names
    /// the path.
    pub fn load_program(&self, path: impl AsRef<Path>) -> anyhow::Result<Program> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("failed to read `{}`", path.display()))?;
        self.name_source(&bytes, path);
        self.load_program_bytes(&bytes).with_context(|| format!("failed to load `{}`", path.display()))
    }

    /// Loads whatever runs as a process: a component of the `process` world, or an
    /// unmodified WASI program (a component exporting `wasi:cli/run`, or a preview 1
    /// core module with `_start`), from Wasm or from a file made by
    /// [`Runtime::precompile`].
    ///
    /// # Errors
    ///
    /// The bytes are not Wasm, are past a compile limit ([`Config::max_module_size`],
    /// [`Config::max_functions`], [`Config::max_function_size`]; the error names it), do
    /// not compile, import something the host does not provide, fit none of those shapes
    /// (the error says what is missing), or were precompiled under other settings (the
    /// error names the setting) or not with this user's key (see
    /// [`Config::trust_precompiled`]).
    pub fn load_program_bytes(&self, bytes: &[u8]) -> anyhow::Result<Program> {
        self.check_wasm(bytes)?;
        let digest = cache::digest(bytes);
        let slot = self.inner.loaded.lock().entry(digest).or_default().clone();
        let mut slot = slot.lock();
        if let Some(program) = &*slot {
            self.inner.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(program.clone());
        }
        let Built { compiled, image, reference, .. } = self.code(bytes, &digest)?;
        let program = match compiled {
            Compiled::Module(module) => Program::Wasi(self.wasi_module(&module)?),
            Compiled::Component(component) if self.is_command(&component) => {
                Program::Wasi(self.wasi_component(&component, image)?)
            }
            Compiled::Component(component) => Program::Process(self.prepare(component, digest, image, reference)?),
        };
        *slot = Some(program.clone());
        Ok(program)
    }

    /// Whether loading `bytes` would compile them, which may take seconds: not for a
    /// precompiled file, for bytes this runtime has loaded, or for bytes with an entry in
    /// the disk cache (whose checks are made when it is loaded: an entry that fails them
    /// is compiled all the same). For a host that tells its user a long compile is
    /// coming; cheap (a hash of the bytes and a look at one file).
    pub fn would_compile(&self, bytes: &[u8]) -> bool {
        if precompiled::is_precompiled(bytes) {
            return false;
        }
        let digest = cache::digest(bytes);
        // Cloned out of the map before it is locked, as `load_program_bytes` does; a slot
        // held by another loader is a compile under way.
        let slot = self.inner.loaded.lock().get(&digest).cloned();
        if slot.is_some_and(|slot| slot.try_lock().is_some_and(|loaded| loaded.is_some())) {
            return false;
        }
        !self
            .inner
            .disk
            .as_ref()
            .is_some_and(|disk| disk.has_entry(&digest) || disk.has_entry(&hibernate::key(&digest)))
    }

    /// Compiles `bytes` (a component or a core module, as [`Runtime::load_program_bytes`]
    /// takes) into a file that later runtimes load without compiling, provided they
    /// have the same fuel setting, the same wasmproc, and a CPU with the
    /// same features; otherwise loading it fails with an error naming what differs.
    ///
    /// A precompiled file is native code, so the file carries a tag made with this
    /// user's secret key (see [`Config::cache_dir`]): runtimes of this user load it, and
    /// refuse it if it was altered; runtimes of other users (or machines) refuse it unless
    /// told to trust it ([`Config::trust_precompiled`]).
    ///
    /// # Errors
    ///
    /// The bytes are already precompiled, are an ELF file, are not Wasm, are past a
    /// compile limit, or do not compile; or this user's key cannot be read or created.
    pub fn precompile(&self, bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
        ensure!(
            !bytes.starts_with(precompiled::ELF),
            "this is an ELF file (a native program, or wasmtime's precompiled format from \
             `wasmtime compile`), not a WebAssembly module: give `wasmproc compile` the .wasm file"
        );
        ensure!(
            !precompiled::is_precompiled(bytes),
            "the file is already precompiled (made by `wasmproc compile`): `wasmproc run` loads it as it is"
        );
        self.check_wasm(bytes)?;
        // Unsplit: a precompiled file carries no memory image, so its code must copy it.
        let compiled = self.compile(bytes, &cache::digest(bytes), false)?.compiled;
        let inner = &self.inner;
        precompiled::write(&inner.engine, &inner.config, &inner.key, &compiled, bytes)
    }

    /// Names the file `bytes` were read from, so that the disk cache entry a later load,
    /// inspection or precompile of them writes says where its code came from
    /// ([`CacheEntry::source`](super::CacheEntry::source), `wasmproc cache ls`).
    /// [`Runtime::load`] and [`Runtime::load_program`] name their file themselves.
    pub fn name_source(&self, bytes: &[u8], source: &Path) {
        self.inner.sources.lock().insert(cache::digest(bytes), source.display().to_string());
    }

    /// What the loads so far have done.
    pub fn stats(&self) -> LoadStats {
        let inner = &self.inner;
        LoadStats {
            compiled: inner.compiled.load(Ordering::Relaxed),
            disk_hits: inner.disk_hits.load(Ordering::Relaxed),
            memory_hits: inner.memory_hits.load(Ordering::Relaxed),
        }
    }

    /// What whole-instance hibernation has done so far, over the processes of every
    /// component this runtime loaded (see [`Config::hibernate_instances`]).
    pub fn hibernation_stats(&self) -> HibernationStats {
        self.inner.hibernation.stats()
    }

    /// The runtime's settings.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub(super) fn disk(&self) -> Option<&DiskCache> {
        self.inner.disk.as_ref()
    }

    /// Refuses what is not Wasm and Wasm past the compile limits (`limits.rs`) before
    /// anything else is done with it; a precompiled file passes, to be checked as one.
    pub(super) fn check_wasm(&self, bytes: &[u8]) -> anyhow::Result<()> {
        if precompiled::is_precompiled(bytes) {
            return Ok(());
        }
        check_magic(bytes)?;
        limits::check(bytes, &self.inner.config)
    }

    /// The compiled code of `bytes` (checked by [`Runtime::check_wasm`]): loaded from a
    /// precompiled file, or compiled; with the memory image taken out of it, if it was
    /// split (`image.rs`), which every instantiation of the code must be given; and the
    /// initial memory whole-instance hibernation compares with (`hibernate.rs`).
    pub(super) fn code(&self, bytes: &[u8], digest: &Digest) -> anyhow::Result<Built> {
        let inner = &self.inner;
        if precompiled::is_precompiled(bytes) {
            let compiled = precompiled::read(&inner.engine, &inner.config, &inner.key, bytes)?;
            Ok(Built { compiled, found: Found::Precompiled, image: None, reference: None, key: *digest })
        } else {
            self.compile(bytes, digest, true)
        }
    }

    /// Compiles a component or a core module (by its header), or finds it in the disk
    /// cache. A component is `prepared` for this host first: given the hooks of
    /// whole-instance hibernation (`hibernate.rs`) where it can have them, and split if
    /// its memory image is large (`image.rs`); its code is then cached under a key
    /// derived from `digest`, so that it is never taken for the component's as given.
    fn compile(&self, bytes: &[u8], digest: &Digest, prepared: bool) -> anyhow::Result<Built> {
        let inner = &self.inner;
        let prepared = prepared && !is_core_module(bytes);
        let split = if prepared { image::split_with_image(bytes) } else { None };
        let image = split.as_ref().map(|(_, image)| image.clone());
        let reference = match prepared && inner.config.hibernate_instances {
            true => match hibernate::Reference::of(bytes) {
                Ok(reference) => Some(Arc::new(reference)),
                Err(why) => {
                    tracing::debug!("the component's processes are never hibernated whole: {why}");
                    None
                }
            },
            false => None,
        };
        let key = if prepared { hibernate::key(digest) } else { *digest };
        if let Some(compiled) = inner.disk.as_ref().and_then(|disk| disk.read(&inner.engine, &key)) {
            inner.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Built { compiled, found: Found::OnDisk, image, reference, key });
        }
        let instrumented = match prepared {
            true => hibernate::instrument(bytes)
                .inspect_err(|why| tracing::debug!("the component's processes are never hibernated whole: {why}"))
                .ok(),
            false => None,
        };
        // The image taken out of the instrumented component is the one taken out of the
        // component as given: instrumenting adds functions and exports, not data.
        let source: std::borrow::Cow<'_, [u8]> = match (&instrumented, &split) {
            (Some(instrumented), Some((split, _))) => match image::split(instrumented) {
                Some(instrumented) => instrumented.stripped.into(),
                None => split.stripped.as_slice().into(),
            },
            (Some(instrumented), None) => instrumented.as_slice().into(),
            (None, Some((split, _))) => split.stripped.as_slice().into(),
            (None, None) => bytes.into(),
        };
        let compiled = if is_core_module(&source) {
            wasmtime::Module::new(&inner.engine, &source).map(Compiled::Module).map_err(anyhow::Error::from)
        } else {
            wasmtime::component::Component::new(&inner.engine, &source)
                .map(Compiled::Component)
                .map_err(anyhow::Error::from)
        }
        .context("failed to compile")?;
        inner.compiled.fetch_add(1, Ordering::Relaxed);
        crate::heap::compiled();
        if let Some(disk) = &inner.disk {
            let source = inner.sources.lock().get(digest).cloned();
            disk.write(&key, &compiled, source.as_deref());
        }
        Ok(Built { compiled, found: Found::Compiled, image, reference, key })
    }

    /// Whether `component` is a WASI command rather than a process (see
    /// [`wasi::is_command`]).
    pub(super) fn is_command(&self, component: &wasmtime::component::Component) -> bool {
        wasi::is_command(&self.inner.engine, component)
    }

    fn wasi_linkers(&self) -> anyhow::Result<&WasiLinkers> {
        if let Some(linkers) = self.inner.wasi_linkers.get() {
            return Ok(linkers);
        }
        let linkers = WasiLinkers::new(&self.inner.engine)?;
        // Two threads may both link; the loser's linkers are dropped.
        Ok(self.inner.wasi_linkers.get_or_init(|| linkers))
    }

    fn wasi_component(
        &self,
        component: &wasmtime::component::Component,
        image: Option<Arc<GuestImage>>,
    ) -> anyhow::Result<WasiProgram> {
        let code = self.wasi_linkers()?.component(component, image)?;
        Ok(self.wasi_program(code))
    }

    /// A WASI program of a core module; the checks and linking of its load.
    pub(super) fn wasi_module(&self, module: &wasmtime::Module) -> anyhow::Result<WasiProgram> {
        let code = self.wasi_linkers()?.module(module)?;
        Ok(self.wasi_program(code))
    }

    fn wasi_program(&self, code: Code) -> WasiProgram {
        let inner = &self.inner;
        WasiProgram::new(code, inner.engine.clone(), inner.config.clone(), inner.clock.clone())
    }

    /// Checks `compiled` against the world and reads its entries.
    pub(super) fn prepare(
        &self,
        compiled: wasmtime::component::Component,
        digest: Digest,
        image: Option<Arc<GuestImage>>,
        reference: Option<Arc<hibernate::Reference>>,
    ) -> anyhow::Result<Component> {
        let inner = &self.inner;
        let counts = inner.hibernation.clone();
        let prepared = super::component::Prepared { digest, image, reference, counts };
        Component::prepare(&inner.linker, &inner.engine, &inner.config, &inner.clock, compiled, prepared)
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("config", &self.inner.config).field("stats", &self.stats()).finish()
    }
}

/// Refuses bytes that are not Wasm at all before wasmtime does, with a message that says
/// so.
fn check_magic(bytes: &[u8]) -> anyhow::Result<()> {
    ensure!(
        bytes.starts_with(b"\0asm"),
        "not a WebAssembly file: it does not start with the `\\0asm` header (nor is it a file made by \
         `wasmproc compile`)"
    );
    Ok(())
}

/// Refuses a file by its first bytes (`start`: [`PROGRAM_START`] of them, or the whole
/// file if shorter) when it can be no program: neither Wasm nor a precompiled file (nor
/// an ELF file, which the loader names). Lets a caller refuse a large file before reading
/// it whole, with the error a load of it would give.
///
/// # Errors
///
/// `start` is not the beginning of a program.
pub fn check_start(start: &[u8]) -> anyhow::Result<()> {
    if precompiled::is_precompiled(start) { Ok(()) } else { check_magic(start) }
}

/// How many first bytes [`check_start`] needs to tell a program from anything else.
pub const PROGRAM_START: usize = 32;

/// Whether `bytes` are a core module of version 1 (components have another version).
fn is_core_module(bytes: &[u8]) -> bool {
    bytes.get(..8) == Some(&[0, b'a', b's', b'm', 1, 0, 0, 0])
}

/// Refuses bytes that are not a component before wasmtime does, with a message that
/// says what they are instead.
fn check_header(bytes: &[u8]) -> anyhow::Result<()> {
    check_magic(bytes)?;
    ensure!(
        !is_core_module(bytes),
        "this is a core WebAssembly module, not a component: build the guest for `wasm32-wasip2` \
         (or wrap the module with `wasm-tools component new`)"
    );
    Ok(())
}

/// Where [`Runtime::code`] found compiled code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// In a file made by [`Runtime::precompile`].
    Precompiled,
    /// In the disk cache.
    OnDisk,
    /// Nowhere: it was compiled now.
    Compiled,
}

/// What [`Runtime::load_program`] found.
#[derive(Clone, Debug)]
pub enum Program {
    /// A component of the `process` world.
    Process(Component),
    /// An unmodified WASI program, run as a one-step process (see [`WasiProgram`]).
    Wasi(WasiProgram),
}

/// What [`Runtime::code`] found: the compiled code, where, what its instantiations need,
/// and its disk cache key.
pub(super) struct Built {
    pub(super) compiled: Compiled,
    pub(super) found: Found,
    pub(super) image: Option<Arc<GuestImage>>,
    pub(super) reference: Option<Arc<hibernate::Reference>>,
    pub(super) key: Digest,
}
