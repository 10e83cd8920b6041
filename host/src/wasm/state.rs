//! What a process's store holds: its WASI context (nothing granted), its memory limit,
//! and what its host imports need.

use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, format_err};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::wasmproc::process::{host, types};
use super::convert;
use super::engine::{CORE_INSTANCES_PER_PROCESS, MEMORIES_PER_PROCESS, TABLE_ELEMENTS, TABLES_PER_PROCESS};
use super::log::{GuestOutput, Level, LogRecord, LogSink, LogSource};
use super::process::Ticks;
use crate::process::Pid;

/// The data of one process's `Store`.
pub(crate) struct ProcessState {
    pid: Pid,
    log: LogSink,
    /// Made on the guest's first WASI call: most processes make none, and building one
    /// seeds two random generators and boxes a dozen parts (about a microsecond and
    /// 1 KiB of heap a process, for nothing, on the lifecycle benchmark).
    wasi: Option<Box<WasiCtx>>,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    /// Epoch ticks its steps have seen (see `process::watch`).
    pub(crate) ticks: Ticks,
}

impl ProcessState {
    /// The state of process `pid`, with WASI granting nothing: no preopened directories,
    /// no environment, no arguments, no network, and stdin at end of file. Clocks and
    /// randomness stay (Rust's std seeds its hash maps from them); stdout and stderr go
    /// to the log, line by line.
    pub(crate) fn new(pid: Pid, log: LogSink, max_memory: usize) -> Self {
        ProcessState {
            pid,
            log,
            wasi: None,
            table: ResourceTable::new(),
            limiter: MemoryLimiter { max_memory },
            ticks: Ticks::default(),
        }
    }
}

/// The WASI context of process `pid` (see [`ProcessState::new`]).
fn new_wasi(pid: Pid, log: &LogSink) -> WasiCtx {
    WasiCtxBuilder::new()
        .stdout(GuestOutput::new(pid, LogSource::Stdout, log.clone()))
        .stderr(GuestOutput::new(pid, LogSource::Stderr, log.clone()))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}

impl ProcessState {
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Logs a line about this process on the host's behalf.
    pub(crate) fn log_host(&self, level: Level, message: &str) {
        (self.log)(&LogRecord { pid: self.pid, source: LogSource::Log(level), message });
    }
}

impl WasiView for ProcessState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let wasi = self.wasi.get_or_insert_with(|| Box::new(new_wasi(self.pid, &self.log)));
        WasiCtxView { ctx: wasi, table: &mut self.table }
    }
}

impl host::Host for ProcessState {
    fn log(&mut self, level: host::Level, message: String) {
        let level = match level {
            host::Level::Trace => Level::Trace,
            host::Level::Debug => Level::Debug,
            host::Level::Info => Level::Info,
            host::Level::Warn => Level::Warn,
            host::Level::Error => Level::Error,
        };
        self.log_host(level, &message);
    }

    fn send(&mut self, to: types::Pid, topic: String, body: types::Payload) -> wasmtime::Result<Result<(), String>> {
        let body = convert::payload_from_wit(body);
        crate::scheduler::worker::send_from_step(self.pid, Pid::from_u64(to), topic, body).map_err(wasmtime::Error::msg)
    }
}

impl types::Host for ProcessState {}

/// Caps a process's linear memory. Growth past the cap traps with an error that names the
/// limit, instead of `memory.grow` returning -1 and the guest's allocator aborting with a
/// message that does not say why.
///
/// It also bounds what else a store may create (core instances, tables and their
/// elements, memories): with on-demand allocation nothing else does (see `engine.rs`).
pub(crate) struct MemoryLimiter {
    pub(crate) max_memory: usize,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max_memory {
            return Err(format_err!(
                "memory limit exceeded: the process asked to grow its memory from {current} to {desired} bytes, \
                 past its `max_memory` of {} bytes",
                self.max_memory
            ));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Past the bound, `table.grow` returns -1, as the spec allows, and a table whose
        // initial size is past it fails instantiation with wasmtime's "exceeds table
        // limits".
        Ok(desired <= TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        CORE_INSTANCES_PER_PROCESS
    }

    fn tables(&self) -> usize {
        TABLES_PER_PROCESS
    }

    fn memories(&self) -> usize {
        MEMORIES_PER_PROCESS
    }
}
