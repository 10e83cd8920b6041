//! [`Runtime`] (the engine, the linker and the module cache) and [`Component`] (a loaded
//! guest, ready to instantiate).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Engine, Store};

use super::bindings::{Process as Guest, ProcessIndices, ProcessPre};
use super::cache::{self, Compiled, Digest, DiskCache};
use super::command::{self, Command, CommandState, P1State};
use super::config::Config;
use super::engine::{EpochClock, new_engine};
use super::key::KeyFile;
use super::limits;
use super::log::LogSink;
use super::precompiled;
use super::process::{WasmProcess, guest_error};
use super::state::ProcessState;
use crate::dispatch::Factory;
use crate::process::{Pid, Process};

/// The world every process component must target; named in load errors.
pub(crate) const WORLD: &str = "wasmproc:process/process@0.1.0";

/// Loads and compiles components, and holds what their processes share: the engine
/// (with its memory arena and epoch thread) and the linker. Cheap to clone; build one
/// per host (each runtime reserves its own arena, see [`Config::max_instances`]).
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
    clock: EpochClock,
    linker: Linker<ProcessState>,
    config: Config,
    disk: Option<DiskCache>,
    /// This user's key, which authenticates the disk cache and precompiled files.
    key: Arc<KeyFile>,
    /// The linkers of WASI commands, made when the first one is loaded.
    command_linkers: OnceLock<CommandLinkers>,
    /// One slot per module: a second loader of a module waits for the first one's
    /// compile instead of compiling it again.
    loaded: Mutex<FxHashMap<Digest, Arc<Mutex<Option<Program>>>>>,
    // Counters for `stats` only: they order nothing, so `Relaxed`.
    compiled: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
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
    /// Creates the engine (reserving the memory arena) and starts its epoch thread.
    ///
    /// # Errors
    ///
    /// An out-of-range setting, or an engine or thread that could not be created (for
    /// example: the arena's address-space reservation was refused).
    pub fn new(config: Config) -> anyhow::Result<Runtime> {
        let (engine, clock) = new_engine(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(anyhow::Error::from)
            .context("failed to link WASI")?;
        Guest::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
            .map_err(anyhow::Error::from)
            .context("failed to link the host imports")?;
        let key = Arc::new(KeyFile::new(config.resolved_key_file()));
        let disk = config.resolved_cache_dir().map(|dir| DiskCache::new(dir, &engine, key.clone()));
        let shared = Shared {
            engine,
            clock,
            linker,
            config,
            disk,
            key,
            command_linkers: OnceLock::new(),
            loaded: Mutex::default(),
            compiled: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
        };
        Ok(Runtime { shared: Arc::new(shared) })
    }

    /// Problems with the host's set-up found when the runtime started, for the embedder to
    /// show. There are none to find today: the one there was, a `max_instances` that the
    /// kernel's limit on memory mappings (`vm.max_map_count`) could not hold, went away
    /// with the memory arena, which is one mapping whatever the number of processes.
    pub fn warnings(&self) -> &[String] {
        &[]
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
            Program::Command(_) => bail!(
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
        let slot = self.shared.loaded.lock().entry(digest).or_default().clone();
        let mut slot = slot.lock();
        if let Some(program) = &*slot {
            self.shared.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(program.clone());
        }
        let program = match self.code(bytes, &digest)?.0 {
            Compiled::Module(module) => Program::Command(self.command_module(&module)?),
            Compiled::Component(component) if self.is_command(&component) => {
                Program::Command(self.command_component(&component)?)
            }
            Compiled::Component(component) => Program::Process(self.prepare(component)?),
        };
        *slot = Some(program.clone());
        Ok(program)
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
        let (compiled, _) = self.compile(bytes, &cache::digest(bytes))?;
        let shared = &self.shared;
        precompiled::write(&shared.engine, &shared.config, &shared.key, &compiled, bytes)
    }

    /// Describes the program in `bytes` without running it: what it is, whether it fits
    /// the `process` world (and if not, why), its entry methods, imports and exports,
    /// and whether the disk cache already held its compiled code.
    ///
    /// # Errors
    ///
    /// The bytes are not Wasm, are past a compile limit, or do not compile, or are a
    /// precompiled file that cannot be loaded (the error says why).
    pub fn inspect(&self, bytes: &[u8]) -> anyhow::Result<Inspection> {
        let shared = &self.shared;
        let is_precompiled = precompiled::is_precompiled(bytes);
        self.check_wasm(bytes)?;
        let digest = cache::digest(bytes);
        let (compiled, found) = self.code(bytes, &digest)?;
        // After the load, which decided whether the cache directory may be used.
        let cache_entry =
            shared.disk.as_ref().filter(|disk| !is_precompiled && disk.is_usable()).map(|disk| disk.entry(&digest));
        let (kind, imports, exports) = match &compiled {
            Compiled::Module(module) => {
                let has_start = module.get_export("_start").is_some();
                let kind = if has_start { ProgramKind::WasiModule } else { ProgramKind::OtherModule };
                let imports = module.imports().map(|i| format!("{}#{}", i.module(), i.name())).collect();
                (kind, imports, module.exports().map(|e| e.name().to_owned()).collect())
            }
            Compiled::Component(component) => {
                let ty = component.component_type();
                let imports = ty.imports(&shared.engine).map(|(name, _)| name.to_owned()).collect();
                let exports: Vec<String> = ty.exports(&shared.engine).map(|(name, _)| name.to_owned()).collect();
                let kind = if self.is_command(component) { ProgramKind::WasiCommand } else { ProgramKind::Process };
                (kind, imports, exports)
            }
        };
        let (entries, problem) = match (&kind, compiled) {
            (ProgramKind::Process, Compiled::Component(component)) => match self.prepare(component) {
                Ok(component) => (component.entries().to_vec(), None),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
            },
            // What `run` would say: the checks of a command's load, linking included.
            (ProgramKind::WasiModule, Compiled::Module(module)) => match self.command_module(&module) {
                Ok(_) => (vec![command::COMMAND_ENTRY.to_owned()], None),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
            },
            (ProgramKind::WasiCommand, _) => (vec![command::COMMAND_ENTRY.to_owned()], None),
            (ProgramKind::OtherModule, _) => (
                Vec::new(),
                Some(format!(
                    "a core module without a `_start` export: neither a WASI command nor a process \
                     (processes are components of the `{WORLD}` world)"
                )),
            ),
            (ProgramKind::WasiModule, Compiled::Component(_)) | (ProgramKind::Process, Compiled::Module(_)) => {
                unreachable!("programs are classified by what they compiled to, above")
            }
        };
        Ok(Inspection {
            kind,
            size: bytes.len() as u64,
            sha256: cache::hex(&digest),
            source_sha256: precompiled::header(bytes).map(|header| header.source_sha256().to_owned()),
            precompiled: is_precompiled,
            cached: found == Found::OnDisk,
            cache_entry,
            problem,
            entries,
            imports,
            exports,
        })
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

    /// Refuses what is not Wasm and Wasm past the compile limits (`limits.rs`) before
    /// anything else is done with it; a precompiled file passes, to be checked as one.
    fn check_wasm(&self, bytes: &[u8]) -> anyhow::Result<()> {
        if precompiled::is_precompiled(bytes) {
            return Ok(());
        }
        check_magic(bytes)?;
        limits::check(bytes, &self.shared.config)
    }

    /// The compiled code of `bytes` (checked by [`Runtime::check_wasm`]): loaded from a
    /// precompiled file, or compiled.
    fn code(&self, bytes: &[u8], digest: &Digest) -> anyhow::Result<(Compiled, Found)> {
        let shared = &self.shared;
        if precompiled::is_precompiled(bytes) {
            let compiled = precompiled::read(&shared.engine, &shared.config, &shared.key, bytes)?;
            Ok((compiled, Found::Precompiled))
        } else {
            self.compile(bytes, digest)
        }
    }

    /// Compiles a component or a core module (by its header), or finds it in the disk
    /// cache.
    fn compile(&self, bytes: &[u8], digest: &Digest) -> anyhow::Result<(Compiled, Found)> {
        let shared = &self.shared;
        if let Some(compiled) = shared.disk.as_ref().and_then(|disk| disk.read(&shared.engine, digest)) {
            shared.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((compiled, Found::OnDisk));
        }
        let compiled = if is_core_module(bytes) {
            wasmtime::Module::new(&shared.engine, bytes).map(Compiled::Module).map_err(anyhow::Error::from)
        } else {
            wasmtime::component::Component::new(&shared.engine, bytes)
                .map(Compiled::Component)
                .map_err(anyhow::Error::from)
        }
        .context("failed to compile")?;
        shared.compiled.fetch_add(1, Ordering::Relaxed);
        if let Some(disk) = &shared.disk {
            disk.write(digest, &compiled);
        }
        Ok((compiled, Found::Compiled))
    }

    /// Whether `component` is a WASI command rather than a process: it exports
    /// `wasi:cli/run` and not the world's `step`.
    fn is_command(&self, component: &wasmtime::component::Component) -> bool {
        let ty = component.component_type();
        let names: Vec<&str> = ty.exports(&self.shared.engine).map(|(name, _)| name).collect();
        names.iter().any(|name| name.starts_with("wasi:cli/run@")) && !names.contains(&"step")
    }

    fn command_linkers(&self) -> anyhow::Result<&CommandLinkers> {
        if let Some(linkers) = self.shared.command_linkers.get() {
            return Ok(linkers);
        }
        let engine = &self.shared.engine;
        let mut component = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut component)
            .map_err(anyhow::Error::from)
            .context("failed to link WASI")?;
        let mut module = wasmtime::Linker::new(engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut module, |state: &mut P1State| &mut state.wasi)
            .map_err(anyhow::Error::from)
            .context("failed to link WASI preview 1")?;
        // Two threads may both link; the loser's linkers are dropped.
        Ok(self.shared.command_linkers.get_or_init(|| CommandLinkers { component, module }))
    }

    fn command_component(&self, component: &wasmtime::component::Component) -> anyhow::Result<Command> {
        let pre = self
            .command_linkers()?
            .component
            .instantiate_pre(component)
            .map_err(anyhow::Error::from)
            .context("the WASI command needs something wasmproc does not provide")?;
        let unknown_run = "the component's `wasi:cli/run` export is not the one wasmproc knows";
        let indices = wasmtime_wasi::p2::bindings::sync::CommandIndices::new(&pre)
            .map_err(anyhow::Error::from)
            .context(unknown_run)?;
        let preemptible =
            wasmtime_wasi::p2::bindings::CommandIndices::new(&pre).map_err(anyhow::Error::from).context(unknown_run)?;
        Ok(self.command(command::Code::Component(pre, indices, preemptible)))
    }

    fn command_module(&self, module: &wasmtime::Module) -> anyhow::Result<Command> {
        ensure!(
            module.get_export("_start").is_some(),
            "a core module without a `_start` export is neither a WASI command nor a process: processes are \
             components of the `{WORLD}` world (build the guest for `wasm32-wasip2`)"
        );
        if let Some(problem) = start_problem(module) {
            bail!("{problem}");
        }
        // wasmtime-wasi's preview 1 functions find their arguments in the caller's export
        // `memory`, and fail every call without one.
        let imports_wasi = module.imports().any(|import| import.module() == "wasi_snapshot_preview1");
        ensure!(
            !imports_wasi || matches!(module.get_export("memory"), Some(wasmtime::ExternType::Memory(_))),
            "the module imports WASI preview 1 functions but exports no memory named `memory`, where they \
             read and write their arguments: every call would fail (export the module's memory as `memory`)"
        );
        let pre = self
            .command_linkers()?
            .module
            .instantiate_pre(module)
            .map_err(anyhow::Error::from)
            .context("the WASI program needs something wasmproc does not provide")?;
        Ok(self.command(command::Code::Module(pre)))
    }

    fn command(&self, code: command::Code) -> Command {
        let shared = &self.shared;
        Command::new(code, shared.engine.clone(), shared.config.clone(), shared.clock.clone())
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
        // `entries` is the host asking, not the process running, so it is not charged to
        // a process's fuel budget: the instantiation's unbounded fuel stays (a small
        // budget would otherwise make every component fail to load, as a bad module).
        // The init time limit, the store's deadline, bounds it instead.
        let entries = guest.call_entries(&mut store).map_err(|e| guest_error(e, "entries", &limits, store.data()))?;
        ensure!(!entries.is_empty(), "the component exports no entry methods (`entries` returned none)");

        let indices =
            ProcessIndices::new(pre.instance_pre()).map_err(anyhow::Error::from).with_context(not_a_process)?;
        let loaded = Loaded {
            pre,
            indices,
            entries,
            log: shared.config.log.clone(),
            clock: shared.clock.clone(),
            config: shared.config.clone(),
        };
        Ok(Component { loaded: Arc::new(loaded), limits })
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("config", &self.shared.config).field("stats", &self.stats()).finish()
    }
}

/// Why a core module's `_start` export cannot start a WASI command, if it cannot: it must
/// be a function of no parameters and no results.
fn start_problem(module: &wasmtime::Module) -> Option<String> {
    match module.get_export("_start")? {
        wasmtime::ExternType::Func(ty) if ty.params().len() == 0 && ty.results().len() == 0 => None,
        wasmtime::ExternType::Func(ty) => Some(format!(
            "the module's `_start` export is a function of type {ty}; a WASI command's `_start` takes no \
             parameters and returns nothing"
        )),
        other => Some(format!("the module's `_start` export is not a function but {}", extern_kind(&other))),
    }
}

fn extern_kind(ty: &wasmtime::ExternType) -> &'static str {
    match ty {
        wasmtime::ExternType::Func(_) => "a function",
        wasmtime::ExternType::Global(_) => "a global",
        wasmtime::ExternType::Table(_) => "a table",
        wasmtime::ExternType::Memory(_) => "a memory",
        wasmtime::ExternType::Tag(_) => "a tag",
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

struct CommandLinkers {
    component: Linker<CommandState>,
    module: wasmtime::Linker<P1State>,
}

/// Where [`Runtime::code`] found compiled code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
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
    /// An unmodified WASI program, run as a one-step process (see [`Command`]).
    Command(Command),
}

/// What a program is; see [`Inspection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgramKind {
    /// A component that should be of the `process` world (see [`Inspection::problem`]
    /// for whether it is).
    Process,
    /// A component exporting `wasi:cli/run`.
    WasiCommand,
    /// A preview 1 core module with `_start`.
    WasiModule,
    /// A core module that is no WASI command.
    OtherModule,
}

impl ProgramKind {
    /// A short description, as `wasmproc inspect` prints it.
    pub fn describe(self) -> &'static str {
        match self {
            ProgramKind::Process => "process component (wasmproc:process world)",
            ProgramKind::WasiCommand => "WASI command component (wasi:cli/run)",
            ProgramKind::WasiModule => "WASI preview 1 command module (_start)",
            ProgramKind::OtherModule => "core module (not runnable)",
        }
    }
}

/// What [`Runtime::inspect`] found.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Inspection {
    /// What the program is.
    pub kind: ProgramKind,
    /// The file's size in bytes.
    pub size: u64,
    /// The SHA-256 of the file, in hex.
    pub sha256: String,
    /// For a precompiled file: the SHA-256 of the Wasm it was compiled from, in hex, as
    /// its header says.
    pub source_sha256: Option<String>,
    /// Whether the file was made by `wasmproc compile`.
    pub precompiled: bool,
    /// Whether the compiled code was loaded from the disk cache (it held a usable entry
    /// before this inspection) rather than compiled now.
    pub cached: bool,
    /// The disk cache's file for it (absent for precompiled files, without a disk cache,
    /// and when the cache directory was refused).
    pub cache_entry: Option<PathBuf>,
    /// Why it cannot run, if it cannot (for example the world export it lacks).
    pub problem: Option<String>,
    /// Its entry methods (`run` for a WASI command).
    pub entries: Vec<String>,
    /// What it imports: interface names for components, `module#name` for modules.
    pub imports: Vec<String>,
    /// What it exports.
    pub exports: Vec<String>,
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
    /// Where the exports are, found and type-checked once for every instance.
    pub(crate) indices: ProcessIndices,
    pub(crate) entries: Vec<String>,
    pub(crate) log: LogSink,
    pub(crate) clock: EpochClock,
    pub(crate) config: Config,
}

/// Per-process limits; see [`Config::max_memory`], [`Config::time_slice`],
/// [`Config::fuel`] and [`Config::cpu_budget`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_memory: usize,
    pub(crate) time_slice: Duration,
    pub(crate) time_slice_ticks: u64,
    /// The whole life's fuel budget; `None` when the engine does not meter fuel.
    pub(crate) fuel: Option<u64>,
    pub(crate) cpu_budget: Option<Duration>,
    pub(crate) cpu_budget_ticks: u64,
    pub(crate) init_time_limit: Duration,
    pub(crate) init_ticks: u64,
}

impl Limits {
    fn new(config: &Config, max_memory: usize, time_slice: Duration) -> Self {
        Limits {
            max_memory,
            time_slice,
            time_slice_ticks: config.ticks(time_slice),
            fuel: config.fuel,
            cpu_budget: config.cpu_budget,
            cpu_budget_ticks: config.cpu_budget.map_or(u64::MAX, |budget| config.ticks(budget)),
            init_time_limit: config.init_time_limit,
            init_ticks: config.ticks(config.init_time_limit),
        }
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
    /// `bytes` is above the runtime's `max_memory`: the memory arena's slots hold no more.
    pub fn with_max_memory(&self, bytes: usize) -> anyhow::Result<Component> {
        let arena_max = self.loaded.config.max_memory;
        ensure!(bytes <= arena_max, "`max_memory` of {bytes} bytes is above the runtime's `max_memory` of {arena_max}");
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
    store.set_epoch_deadline(limits.init_ticks);
    fuel_for_instantiation(&mut store, limits.fuel);
    store
}

/// Lets `store` instantiate whatever its fuel `budget`. Instantiation copies the guest's
/// data segments into its memory with metered code (there are no copy-on-write images
/// with the memory arena; see `engine.rs`), at one unit of fuel a byte, and a budget is
/// for what the guest runs from `init` on, not for the size of its data; the time slice
/// still bounds instantiation. [`refuel`] sets the budget once the instance is made.
pub(crate) fn fuel_for_instantiation<T>(store: &mut Store<T>, budget: Option<u64>) {
    if budget.is_some() {
        // Only fails when the engine does not meter fuel, and a budget is set exactly
        // when it does (both come from `Config::fuel`).
        let _ = store.set_fuel(u64::MAX);
    }
}

/// Gives `store` its whole fuel `budget`, if it has one; see [`fuel_for_instantiation`].
pub(crate) fn refuel<T>(store: &mut Store<T>, budget: Option<u64>) {
    if let Some(budget) = budget {
        // As in `fuel_for_instantiation`.
        let _ = store.set_fuel(budget);
    }
}
