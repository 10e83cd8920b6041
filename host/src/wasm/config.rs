//! [`Config`]: the settings of a [`Runtime`](super::Runtime), with their defaults.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::log::{LogRecord, LogSink, stderr_sink};

const MIB: usize = 1024 * 1024;

/// Settings of a [`Runtime`](super::Runtime). Every setting has a default (see each
/// method); `Config::default()` is what `wasmproc run` uses.
#[derive(Clone)]
pub struct Config {
    pub(crate) max_memory: usize,
    pub(crate) time_slice: Duration,
    pub(crate) fuel: Option<u64>,
    pub(crate) epoch_tick: Duration,
    pub(crate) max_instances: u32,
    pub(crate) cache_dir: CacheDir,
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
            max_memory: 64 * MIB,
            time_slice: Duration::from_millis(100),
            fuel: None,
            epoch_tick: Duration::from_millis(1),
            max_instances: 10_000,
            cache_dir: CacheDir::Default,
            log: stderr_sink(),
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

    /// How long one call into a guest (`init` or a `step`) may run before it is stopped
    /// with an error naming this limit. Measured in epoch ticks, so it is accurate to
    /// about one [`Config::epoch_tick`]. By default 100 ms.
    pub fn time_slice(mut self, slice: Duration) -> Self {
        self.time_slice = slice;
        self
    }

    /// Gives every process a total budget of `units` of fuel (about one unit per Wasm
    /// instruction) over its whole life from `init` on (instantiation, which copies the
    /// guest's data into its memory, is not charged); a process that uses it up is ended
    /// with an error naming this limit. Unlike the time slice, fuel is deterministic: the
    /// same guest with the same input runs out at the same instruction on any machine.
    ///
    /// Metering is compiled into the guest's code, so a runtime with a fuel budget
    /// compiles (and caches) components separately from one without, and its guests run
    /// somewhat slower (see BENCHMARKS.md). By default no budget and no metering.
    pub fn fuel(mut self, units: u64) -> Self {
        self.fuel = Some(units);
        self
    }

    /// How often the runtime's epoch thread ticks: the resolution of
    /// [`Config::time_slice`]. A shorter tick costs a wakeup more often, in every runtime,
    /// even when idle. By default 1 ms.
    pub fn epoch_tick(mut self, tick: Duration) -> Self {
        self.epoch_tick = tick;
        self
    }

    /// How many Wasm processes may be instantiated at once: the number of slots in the
    /// memory arena, which reserves its address space up front (see
    /// [`Config::max_memory`]). An instantiation past it fails with an error naming this
    /// limit. By default 10,000 (640 GiB of address space at 64 MiB, nothing of it
    /// committed until used).
    pub fn max_instances(mut self, instances: u32) -> Self {
        self.max_instances = instances;
        self
    }

    /// Keeps compiled components in `dir`, so a later run loads them instead of compiling
    /// again. By default `$XDG_CACHE_HOME/wasmproc`, or `$HOME/.cache/wasmproc`.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = CacheDir::At(dir.into());
        self
    }

    /// Compiles every component afresh in each runtime: nothing is read from or written
    /// to disk. Components loaded twice in one runtime are still compiled once.
    pub fn no_disk_cache(mut self) -> Self {
        self.cache_dir = CacheDir::Disabled;
        self
    }

    /// Sends every log line of every process (its `host.log` calls and its stdout and
    /// stderr, line by line) to `sink`. By default each [`LogRecord`] is printed to the
    /// host's stderr as `[pid 7] stdout: …`.
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

    /// The time slice in epoch ticks, at least one.
    pub(crate) fn time_slice_ticks(&self, slice: Duration) -> u64 {
        let tick = self.epoch_tick.as_nanos().max(1);
        u64::try_from(slice.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX).max(1)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("max_memory", &self.max_memory)
            .field("time_slice", &self.time_slice)
            .field("fuel", &self.fuel)
            .field("epoch_tick", &self.epoch_tick)
            .field("max_instances", &self.max_instances)
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}
