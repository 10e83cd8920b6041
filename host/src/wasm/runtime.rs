//! [`Runtime`] (the engine, the linker and the module cache) and [`Component`] (a loaded
//! guest, ready to instantiate).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Engine, Store};

use super::bindings::{Process as Guest, ProcessPre};
use super::cache::{self, Digest, DiskCache};
use super::config::Config;
use super::engine::new_engine;
use super::log::LogSink;
use super::process::{WasmProcess, guest_error};
use super::state::ProcessState;
use crate::dispatch::Factory;
use crate::process::{Pid, Process};

/// The world every process component must target; named in load errors.
pub(crate) const WORLD: &str = "wasmproc:process/process@0.1.0";

/// Loads and compiles components, and holds what their processes share: the engine
/// (with its instance pool and epoch thread) and the linker. Cheap to clone; build one
/// per host (each runtime reserves its own pool, see [`Config::max_instances`]).
///
/// Loading the same bytes twice, from any path, compiles once: later loads return the
/// first [`Component`]. With a disk cache (the default) a later run of the host loads
/// the compiled code instead of compiling again.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

struct Shared {
    engine: Engine,
    linker: Linker<ProcessState>,
    config: Config,
    disk: Option<DiskCache>,
    /// One slot per module: a second loader of a module waits for the first one's
    /// compile instead of compiling it again.
    loaded: Mutex<FxHashMap<Digest, Arc<Mutex<Option<Component>>>>>,
    // Counters for `stats` only: they order nothing, so `Relaxed`.
    compiled: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
    /// See [`Runtime::warnings`].
    warnings: Vec<String>,
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

impl Runtime {
    /// Creates the engine (reserving the instance pool) and starts its epoch thread.
    ///
    /// # Errors
    ///
    /// An out-of-range setting, or an engine or thread that could not be created (for
    /// example: the pool's address-space reservation was refused).
    pub fn new(config: Config) -> anyhow::Result<Runtime> {
        let engine = new_engine(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(anyhow::Error::from)
            .context("failed to link WASI")?;
        Guest::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
            .map_err(anyhow::Error::from)
            .context("failed to link the host imports")?;
        let warnings = super::engine::map_count_warning(config.max_instances).into_iter().collect();
        let disk = config.resolved_cache_dir().map(|dir| DiskCache::new(dir, &engine));
        let shared = Shared {
            engine,
            linker,
            config,
            disk,
            loaded: Mutex::default(),
            compiled: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            warnings,
        };
        Ok(Runtime { shared: Arc::new(shared) })
    }

    /// Problems with the host's set-up found when the runtime started, for the embedder to
    /// show: today, a `max_instances` the kernel's memory-mapping limit cannot hold.
    pub fn warnings(&self) -> &[String] {
        &self.shared.warnings
    }

    /// Loads the component in the file at `path`: see [`Runtime::load_bytes`].
    ///
    /// # Errors
    ///
    /// The file cannot be read, or as [`Runtime::load_bytes`]; the error names the path.
    pub fn load(&self, path: impl AsRef<Path>) -> anyhow::Result<Component> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("failed to read `{}`", path.display()))?;
        self.load_bytes(&bytes).with_context(|| format!("failed to load `{}`", path.display()))
    }

    /// Loads a component from its bytes: compiles it (or finds it in the caches), checks
    /// that it fits the `process` world, and asks it for its entry methods.
    ///
    /// # Errors
    ///
    /// The bytes are not a component (for example a core module), do not compile, import
    /// something the host does not provide, lack one of the world's exports (the error
    /// names it), or trap in `entries`.
    pub fn load_bytes(&self, bytes: &[u8]) -> anyhow::Result<Component> {
        check_header(bytes)?;
        let digest = cache::digest(bytes);
        let slot = self.shared.loaded.lock().entry(digest).or_default().clone();
        let mut slot = slot.lock();
        if let Some(component) = &*slot {
            self.shared.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(component.clone());
        }
        let compiled = self.compile(bytes, &digest)?;
        let component = self.prepare(compiled)?;
        *slot = Some(component.clone());
        Ok(component)
    }

    /// What the loads so far have done.
    pub fn stats(&self) -> LoadStats {
        let shared = &self.shared;
        LoadStats {
            compiled: shared.compiled.load(Ordering::Relaxed),
            disk_hits: shared.disk_hits.load(Ordering::Relaxed),
            memory_hits: shared.memory_hits.load(Ordering::Relaxed),
        }
    }

    /// The runtime's settings.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    fn compile(&self, bytes: &[u8], digest: &Digest) -> anyhow::Result<wasmtime::component::Component> {
        let shared = &self.shared;
        if let Some(compiled) = shared.disk.as_ref().and_then(|disk| disk.read(&shared.engine, digest)) {
            shared.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(compiled);
        }
        let compiled = wasmtime::component::Component::new(&shared.engine, bytes)
            .map_err(anyhow::Error::from)
            .context("failed to compile the component")?;
        shared.compiled.fetch_add(1, Ordering::Relaxed);
        if let Some(disk) = &shared.disk {
            disk.write(digest, &compiled);
        }
        Ok(compiled)
    }

    /// Checks `compiled` against the world and reads its entries.
    fn prepare(&self, compiled: wasmtime::component::Component) -> anyhow::Result<Component> {
        let shared = &self.shared;
        let not_a_process = || format!("the component does not fit the `{WORLD}` world");
        let pre = shared.linker.instantiate_pre(&compiled).map_err(anyhow::Error::from).with_context(not_a_process)?;
        let pre = ProcessPre::new(pre).map_err(anyhow::Error::from).with_context(not_a_process)?;
        let limits = Limits::new(&shared.config, shared.config.max_memory, shared.config.time_slice);

        let mut store = new_store(&shared.engine, Pid::HOST, shared.config.log.clone(), &limits);
        let guest = pre.instantiate(&mut store).map_err(anyhow::Error::from).context("failed to instantiate")?;
        let entries = guest.call_entries(&mut store).map_err(|e| guest_error(e, "entries", &limits, store.data()))?;
        ensure!(!entries.is_empty(), "the component exports no entry methods (`entries` returned none)");

        let loaded = Loaded { pre, entries, log: shared.config.log.clone(), config: shared.config.clone() };
        Ok(Component { loaded: Arc::new(loaded), limits })
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("config", &self.shared.config).field("stats", &self.stats()).finish()
    }
}

/// Refuses bytes that are not a component before wasmtime does, with a message that
/// says what they are instead.
fn check_header(bytes: &[u8]) -> anyhow::Result<()> {
    const MAGIC: &[u8; 4] = b"\0asm";
    match bytes.get(..8) {
        // Version 1 of the core format.
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => bail!(
            "this is a core WebAssembly module, not a component: build the guest for `wasm32-wasip2` \
             (or wrap the module with `wasm-tools component new`)"
        ),
        // Components and any other version: wasmtime reports what it does not support.
        Some(header) if header.starts_with(MAGIC) => Ok(()),
        _ => bail!("not a WebAssembly component: the file does not start with the `\\0asm` header"),
    }
}

/// A loaded component: compiled, checked against the `process` world, ready to
/// instantiate. Cheap to clone (clones share the compiled code).
///
/// It is a [`Factory`]: register it as a process kind
/// (`Scheduler::builder().kind("hello", component.clone())`) and spawn processes of it by
/// kind, from the embedder ([`Handle::spawn_kind`](crate::Handle::spawn_kind)) or from
/// other processes (the `spawn` command). Or spawn one directly with
/// [`Component::process`].
#[derive(Clone)]
pub struct Component {
    loaded: Arc<Loaded>,
    pub(crate) limits: Limits,
}

pub(crate) struct Loaded {
    pub(crate) pre: ProcessPre<ProcessState>,
    pub(crate) entries: Vec<String>,
    pub(crate) log: LogSink,
    config: Config,
}

/// Per-process limits; see [`Config::max_memory`] and [`Config::time_slice`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_memory: usize,
    pub(crate) time_slice: Duration,
    pub(crate) time_slice_ticks: u64,
}

impl Limits {
    fn new(config: &Config, max_memory: usize, time_slice: Duration) -> Self {
        Limits { max_memory, time_slice, time_slice_ticks: config.time_slice_ticks(time_slice) }
    }
}

impl Component {
    /// The entry methods the component offers, as its `entries` export listed them
    /// when it was loaded.
    pub fn entries(&self) -> &[String] {
        &self.loaded.entries
    }

    /// A new process of this component, not yet initialised: hand it to
    /// [`Handle::spawn`](crate::Handle::spawn).
    pub fn process(&self) -> WasmProcess {
        WasmProcess::new(self.clone())
    }

    /// This component with a lower memory cap for its processes (each process of the
    /// returned component; the original keeps its own). By default the runtime's
    /// [`Config::max_memory`].
    ///
    /// # Errors
    ///
    /// `bytes` is above the runtime's `max_memory`: the instance pool cannot give more.
    pub fn with_max_memory(&self, bytes: usize) -> anyhow::Result<Component> {
        let pool_max = self.loaded.config.max_memory;
        ensure!(bytes <= pool_max, "`max_memory` of {bytes} bytes is above the runtime's `max_memory` of {pool_max}");
        Ok(Component {
            loaded: self.loaded.clone(),
            limits: Limits::new(&self.loaded.config, bytes, self.limits.time_slice),
        })
    }

    /// This component with another time slice for its processes. By default the
    /// runtime's [`Config::time_slice`].
    pub fn with_time_slice(&self, slice: Duration) -> Component {
        Component {
            loaded: self.loaded.clone(),
            limits: Limits::new(&self.loaded.config, self.limits.max_memory, slice),
        }
    }

    /// The memory cap of this component's processes, in bytes.
    pub fn max_memory(&self) -> usize {
        self.limits.max_memory
    }

    /// The time slice of this component's processes.
    pub fn time_slice(&self) -> Duration {
        self.limits.time_slice
    }

    pub(crate) fn loaded(&self) -> &Loaded {
        &self.loaded
    }
}

impl std::fmt::Debug for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Component").field("entries", &self.loaded.entries).field("limits", &self.limits).finish()
    }
}

impl Factory for Component {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        Ok(Box::new(self.process()))
    }
}

/// A store for process `pid`, with its limits in force.
pub(crate) fn new_store(engine: &Engine, pid: Pid, log: LogSink, limits: &Limits) -> Store<ProcessState> {
    let mut store = Store::new(engine, ProcessState::new(pid, log, limits.max_memory));
    store.limiter(|state| &mut state.limiter);
    store.epoch_deadline_trap();
    store.set_epoch_deadline(limits.time_slice_ticks);
    store
}
