//! [`Config`]: the settings of a [`Runtime`](super::Runtime), with their defaults.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::log::{LogRecord, LogSink, tracing_sink};

const MIB: usize = 1024 * 1024;

/// The default of [`Config::max_memory`]: 64 MiB.
pub const DEFAULT_MAX_MEMORY: usize = 64 * MIB;
/// The default of [`Config::time_slice`]: 10 ms.
pub const DEFAULT_TIME_SLICE: Duration = Duration::from_millis(10);
/// The default of [`Config::init_time_limit`]: 100 ms.
pub const DEFAULT_INIT_TIME_LIMIT: Duration = Duration::from_millis(100);
/// The default of [`Config::max_instances`]: 10,000.
pub const DEFAULT_MAX_INSTANCES: u32 = 10_000;
/// The default of [`Config::max_module_size`]: 128 MiB.
pub const DEFAULT_MAX_MODULE_SIZE: usize = 128 * MIB;
/// The default of [`Config::max_functions`]: 100,000.
pub const DEFAULT_MAX_FUNCTIONS: u32 = 100_000;
/// The default of [`Config::max_function_size`]: 1 MiB.
pub const DEFAULT_MAX_FUNCTION_SIZE: usize = MIB;
/// The default of [`Config::max_cache_size`]: 1 GiB (see there why).
pub const DEFAULT_MAX_CACHE_SIZE: u64 = 1 << 30;

/// The default of [`Config::max_core_instances`].
pub const DEFAULT_MAX_CORE_INSTANCES: u32 = 16;
/// The default of [`Config::max_tables`].
pub const DEFAULT_MAX_TABLES: u32 = 8;
/// The default of [`Config::max_table_elements`].
pub const DEFAULT_MAX_TABLE_ELEMENTS: u32 = 50_000;
/// The default of [`Config::max_memories`].
pub const DEFAULT_MAX_MEMORIES: u32 = 1;

/// Settings of a [`Runtime`](super::Runtime). Every setting has a default (see each
/// method); `Config::default()` is what `wasmproc run` uses.
#[derive(Clone)]
pub struct Config {
    pub(crate) max_memory: usize,
    pub(crate) time_slice: Duration,
    pub(crate) fuel: Option<u64>,
    pub(crate) cpu_budget: Option<Duration>,
    pub(crate) preemption: bool,
    pub(crate) hibernate_instances: bool,
    pub(crate) init_time_limit: Duration,
    pub(crate) epoch_tick: Duration,
    pub(crate) max_instances: u32,
    pub(crate) max_core_instances: u32,
    pub(crate) max_tables: u32,
    pub(crate) max_table_elements: u32,
    pub(crate) max_memories: u32,
    pub(crate) cache_dir: CacheDir,
    pub(crate) max_cache_size: u64,
    pub(crate) trust_precompiled: bool,
    pub(crate) max_module_size: usize,
    pub(crate) max_functions: u32,
    pub(crate) max_function_size: usize,
    pub(crate) log: LogSink,
}

#[derive(Clone, Debug)]
pub(crate) enum CacheDir {
    /// `$XDG_CACHE_HOME/wasmproc`, else `$HOME/.cache/wasmproc`, else none.
    Default,
    At(PathBuf),
    Disabled,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_memory: DEFAULT_MAX_MEMORY,
            time_slice: DEFAULT_TIME_SLICE,
            fuel: None,
            cpu_budget: None,
            preemption: true,
            hibernate_instances: true,
            init_time_limit: DEFAULT_INIT_TIME_LIMIT,
            epoch_tick: Duration::from_millis(1),
            max_instances: DEFAULT_MAX_INSTANCES,
            max_core_instances: DEFAULT_MAX_CORE_INSTANCES,
            max_tables: DEFAULT_MAX_TABLES,
            max_table_elements: DEFAULT_MAX_TABLE_ELEMENTS,
            max_memories: DEFAULT_MAX_MEMORIES,
            cache_dir: CacheDir::Default,
            max_cache_size: DEFAULT_MAX_CACHE_SIZE,
            trust_precompiled: false,
            max_module_size: DEFAULT_MAX_MODULE_SIZE,
            max_functions: DEFAULT_MAX_FUNCTIONS,
            max_function_size: DEFAULT_MAX_FUNCTION_SIZE,
            log: tracing_sink(),
        }
    }
}

impl Config {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most linear memory one process may have, in bytes. A guest that grows past it
    /// traps with an error naming the limit. It is also the size of each slot of the
    /// memory arena, which reserves `max_instances × max_memory` bytes of address space
    /// up front: that must fit in the 128 TiB of a 64-bit address space (1M slots of
    /// 64 MiB take 64 TiB). By default 64 MiB.
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = bytes;
        self
    }

    /// How long a step runs before it is preempted: suspended where it is and queued
    /// again behind every process already waiting, so that one busy (or looping) process
    /// cannot hold a worker while others wait. The step resumes, for another slice, on
    /// its next turn. While other processes are waiting it is preempted sooner, at the
    /// next epoch tick, so a busy process delays the others by a tick rather than a slice.
    /// (Without [`Config::preemption`] the step is stopped instead, with
    /// an error naming this limit.) `init` has a limit of its own,
    /// [`Config::init_time_limit`].
    /// Measured in epoch ticks, so it is accurate to about one [`Config::epoch_tick`].
    /// By default 10 ms.
    pub fn time_slice(mut self, slice: Duration) -> Self {
        self.time_slice = slice;
        self
    }

    /// Gives every process a total budget of `units` of fuel (about one unit per Wasm
    /// instruction) over its whole life from `init` on (instantiation, which copies the
    /// guest's data into its memory, is not charged, nor is the runtime's own call of a
    /// component's `entries` when it loads it); a process that uses it up is ended with
    /// an error naming this limit. Unlike the time slice, fuel is deterministic: the
    /// same guest with the same input runs out at the same instruction on any machine.
    ///
    /// Metering is compiled into the guest's code, so a runtime with a fuel budget
    /// compiles (and caches) components separately from one without, and its guests run
    /// somewhat slower (see `docs/perf/sandbox.md`). By default no budget and no metering.
    pub fn fuel(mut self, units: u64) -> Self {
        self.fuel = Some(units);
        self
    }

    /// How long instantiating a process and its `init` may run. `init` runs in the turn
    /// of whoever spawned the process and cannot be suspended, so one past this limit is
    /// stopped and the spawn fails with an error naming it. By default 100 ms: a guest's
    /// `init` only takes its input (its entry method runs in its steps). The limit is
    /// wall time (epoch ticks), not CPU time: on a machine so overloaded that a spawning
    /// thread waits tens of milliseconds for a core, raise it, or spawns of slow-to-start
    /// guests can fail with this error.
    pub fn init_time_limit(mut self, limit: Duration) -> Self {
        self.init_time_limit = limit;
        self
    }

    /// Whether steps past their time slice are preempted (the default) or stopped with an
    /// error naming the limit. A preemptible step runs on a fiber of its own, which costs
    /// some time on every step (see `docs/perf/sandbox.md`); turn it off for trusted guests whose
    /// steps are known to be short.
    pub fn preemption(mut self, on: bool) -> Self {
        self.preemption = on;
        self
    }

    /// Whether a process that has waited past the scheduler's hibernation threshold
    /// (`Builder::hibernate_after`) gives back its whole instance (the default): it keeps
    /// only the pages of its memory that differ from its component's initial image
    /// (compressed) and its globals, and its next event makes the instance again from
    /// them before its step. Components the host cannot capture whole (see
    /// `docs/perf/hibernation.md`: mutable tables, start functions, resources the guest
    /// defines) are never hibernated so. Off, a waiting process gives back only its fiber
    /// stack's pages.
    pub fn hibernate_instances(mut self, on: bool) -> Self {
        self.hibernate_instances = on;
        self
    }

    /// Gives every process a total budget of CPU time over its whole life: the time its
    /// steps ran, not the time it waited. A process past it is ended with an error naming
    /// this limit, at the latest one time slice later. CPU time is counted in epoch ticks
    /// that pass while a step runs: a step charged with every tick it saw, which on
    /// average is its true time however short it is. By default no budget (a looping
    /// process is preempted every slice but lives until it is terminated). Unlike
    /// [`Config::fuel`] this costs nothing in the compiled code.
    pub fn cpu_budget(mut self, budget: Duration) -> Self {
        self.cpu_budget = Some(budget);
        self
    }

    /// How often the runtime's epoch thread ticks: the resolution of
    /// [`Config::time_slice`]. A shorter tick costs a wakeup more often, in every runtime,
    /// even when idle. By default 1 ms.
    pub fn epoch_tick(mut self, tick: Duration) -> Self {
        self.epoch_tick = tick;
        self
    }

    /// How many Wasm processes may be instantiated at once: the memory arena, which
    /// reserves its address space up front (see [`Config::max_memory`]), has this many
    /// slots for each of [`Config::max_memories`]. An instantiation past it fails with an error naming this
    /// limit. By default 10,000 (640 GiB of address space at 64 MiB, nothing of it
    /// committed until used). Under an address-space limit (`ulimit -v`) lower it (or
    /// `max_memory`): the runtime fails to start otherwise, with an error naming both. A
    /// runtime that only compiles or inspects needs 1.
    pub fn max_instances(mut self, instances: u32) -> Self {
        self.max_instances = instances;
        self
    }

    /// The most core module instances one process may have: a component instantiates
    /// each of its core modules once. A process that needs more fails to instantiate (the
    /// spawn, or loading the component, fails) with an error naming this limit. By default
    /// 16: a Rust `wasm32-wasip2` guest has 3 (its module and the shim and fixup modules
    /// `wasm-component-ld` adds), a componentize-js 0.23 guest 4, a componentize-py 0.25
    /// guest 14 (CPython, its libc and the other shared libraries it links are each a
    /// module). Each costs a `vmctx` on the host's heap.
    pub fn max_core_instances(mut self, count: u32) -> Self {
        self.max_core_instances = count;
        self
    }

    /// The most tables one process may have, over all its core instances; more fail
    /// instantiation with an error naming this limit. By default 8: Rust, componentize-py
    /// and componentize-js guests have 2.
    pub fn max_tables(mut self, count: u32) -> Self {
        self.max_tables = count;
        self
    }

    /// The most elements one table of a process may have (8 bytes each, on the host's
    /// heap, for the table's actual size): a table created larger fails instantiation,
    /// and a `table.grow` past it ends the process, with an error naming this limit. By
    /// default 50,000: a componentize-py guest's largest table has 5,674 (CPython's
    /// indirect-call targets), a componentize-js guest's 7,692, a Rust guest's far fewer;
    /// a Python program with large extension modules links more.
    pub fn max_table_elements(mut self, count: u32) -> Self {
        self.max_table_elements = count;
        self
    }

    /// The most linear memories one process may have; more fail instantiation with an
    /// error naming this limit. By default 1, which is what Rust, componentize-py and
    /// componentize-js guests have (their core modules share one memory). Each memory is
    /// a slot of the runtime's memory arena, of [`Config::max_memory`] bytes, so the arena
    /// has `max_instances × max_memories` slots: raising this multiplies the address
    /// space the runtime reserves (see [`Config::max_instances`]). The cap
    /// [`Config::max_memory`] applies to each memory alone.
    pub fn max_memories(mut self, count: u32) -> Self {
        self.max_memories = count;
        self
    }

    /// Keeps compiled components in `dir`, so a later run loads them instead of compiling
    /// again. By default `$XDG_CACHE_HOME/wasmproc`, or `$HOME/.cache/wasmproc`.
    ///
    /// Entries are authenticated with a secret key of this user's, and the directory and
    /// its entries are used only when this user owns them and no one else may write them
    /// (otherwise a warning is logged, once, and components are compiled instead). The key
    /// is `$XDG_CONFIG_HOME/wasmproc/cache.key` (or `$HOME/.config/wasmproc/cache.key`);
    /// with this setting it is `dir/key`, so the runtime keeps everything in `dir`. The
    /// same key signs and checks files made by [`Runtime::precompile`](super::Runtime::precompile).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = CacheDir::At(dir.into());
        self
    }

    /// The most bytes the disk cache's entries may take together: after each write the
    /// least recently used entries are removed until the rest fit (never the one just
    /// written, so a single larger entry is kept alone). By default 1 GiB: twenty of the
    /// largest entries we know of (a JavaScript engine component's code is about 47 MB),
    /// hundreds of Rust guests'.
    pub fn max_cache_size(mut self, bytes: u64) -> Self {
        self.max_cache_size = bytes;
        self
    }

    /// Compiles every component afresh in each runtime: nothing is read from or written
    /// to disk. Components loaded twice in one runtime are still compiled once.
    pub fn no_disk_cache(mut self) -> Self {
        self.cache_dir = CacheDir::Disabled;
        self
    }

    /// Loads files made by [`Runtime::precompile`](super::Runtime::precompile) with
    /// another user's key, or on another machine, on their checksum alone. By default
    /// (`false`) a precompiled file is loaded only if it carries the tag of this user's key
    /// (see [`Config::cache_dir`] for where it is), which shows this user's wasmproc made
    /// it and no one altered it since; any other file is refused with an error that says
    /// so.
    ///
    /// # Safety
    ///
    /// A precompiled file is native code that is loaded into this process without being
    /// checked. With `trust` set, a file crafted by its maker (or altered by anyone who
    /// could write it, with the checksum recomputed) is undefined behaviour: set it only
    /// when every precompiled file this runtime may load comes from a source trusted as
    /// this program's own binary is.
    pub unsafe fn trust_precompiled(mut self, trust: bool) -> Self {
        self.trust_precompiled = trust;
        self
    }

    /// The largest Wasm (module or component, in bytes) the runtime compiles; a larger one
    /// is refused before compiling, with an error naming this limit. By default 128 MiB,
    /// the bound `wasmproc` puts on the files it reads: seven times the largest guests we
    /// know of (a componentize-py component with CPython and its standard library is about
    /// 18 MB, a JavaScript engine component about 10 MB, our Rust guests under 1 MB). What
    /// a compile costs is bounded by [`Config::max_functions`] and
    /// [`Config::max_function_size`]; this bounds the rest (data segments, custom
    /// sections). Files made by [`Runtime::precompile`](super::Runtime::precompile) are not
    /// compiled, so not bound by it.
    pub fn max_module_size(mut self, bytes: usize) -> Self {
        self.max_module_size = bytes;
        self
    }

    /// The most functions the runtime compiles for one module or component: the functions
    /// its core modules define (nested ones included) plus its canonical lifts and lowers
    /// (each compiles a trampoline). More are refused before compiling, with an error
    /// naming this limit. By default 100,000: compiling costs time and memory for each
    /// function, even an empty one, so this bounds that part to seconds and about half a
    /// GiB, while the largest guests we know of (CPython
    /// or a JavaScript engine, with their libc, in a component) have some tens of
    /// thousands.
    pub fn max_functions(mut self, functions: u32) -> Self {
        self.max_functions = functions;
        self
    }

    /// The largest function body (in bytes of Wasm) the runtime compiles; a module with a
    /// larger one is refused before compiling, with an error naming this limit. By default
    /// 1 MiB: the compiler's memory grows with a function's size (a 7 MB function took
    /// 706 MiB, about 100 bytes a byte), and compiling runs one function a core at once,
    /// so this keeps a compile to about 100 MiB a core. The largest functions of real
    /// guests, an interpreter's dispatch loop such as CPython's, are some hundreds of KiB
    /// (an estimate from their native code: raise the limit if a real guest is refused).
    pub fn max_function_size(mut self, bytes: usize) -> Self {
        self.max_function_size = bytes;
        self
    }

    /// Sends every log line of every process (its `host.log` calls and its stdout and
    /// stderr, line by line) to `sink`. By default each [`LogRecord`] becomes a `tracing`
    /// event (target `wasmproc::guest`, fields `pid` and `source`): the library never
    /// writes to the host's streams itself.
    pub fn log_sink(mut self, sink: impl Fn(&LogRecord<'_>) + Send + Sync + 'static) -> Self {
        self.log = Arc::new(sink);
        self
    }

    /// The directory the disk cache uses, if any.
    pub(crate) fn resolved_cache_dir(&self) -> Option<PathBuf> {
        match &self.cache_dir {
            CacheDir::At(dir) => Some(dir.clone()),
            CacheDir::Disabled => None,
            CacheDir::Default => {
                let xdg = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
                let base = xdg.or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
                Some(base.join("wasmproc"))
            }
        }
    }

    /// The file of this user's secret key (see [`Config::cache_dir`]), if there is a
    /// place for one.
    pub(crate) fn resolved_key_file(&self) -> Option<PathBuf> {
        match &self.cache_dir {
            CacheDir::At(dir) => Some(dir.join("key")),
            CacheDir::Default | CacheDir::Disabled => {
                let xdg = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
                let base = xdg.or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
                Some(base.join("wasmproc").join("cache.key"))
            }
        }
    }

    /// `span` in epoch ticks, rounded up, at least one.
    pub(crate) fn ticks(&self, span: Duration) -> u64 {
        let tick = self.epoch_tick.as_nanos().max(1);
        u64::try_from(span.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX).max(1)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("max_memory", &self.max_memory)
            .field("time_slice", &self.time_slice)
            .field("fuel", &self.fuel)
            .field("cpu_budget", &self.cpu_budget)
            .field("preemption", &self.preemption)
            .field("init_time_limit", &self.init_time_limit)
            .field("epoch_tick", &self.epoch_tick)
            .field("max_instances", &self.max_instances)
            .field("max_core_instances", &self.max_core_instances)
            .field("max_tables", &self.max_tables)
            .field("max_table_elements", &self.max_table_elements)
            .field("max_memories", &self.max_memories)
            .field("cache_dir", &self.cache_dir)
            .field("max_cache_size", &self.max_cache_size)
            .field("trust_precompiled", &self.trust_precompiled)
            .field("max_module_size", &self.max_module_size)
            .field("max_functions", &self.max_functions)
            .field("max_function_size", &self.max_function_size)
            .finish_non_exhaustive()
    }
}
