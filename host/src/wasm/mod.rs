//! Wasm processes: components of the `wasmproc:process/process@0.2.1` world (see `wit/`)
//! run as [`Process`](crate::Process)es.
//!
//! ```no_run
//! use wasmproc::Scheduler;
//! use wasmproc::scheduler::Spawnable;
//! use wasmproc::wasm::{Config, Runtime};
//!
//! let runtime = Runtime::new(Config::default())?;
//! let hello = runtime.load("hello.wasm")?;
//! assert!(hello.entries().iter().any(|entry| entry == "main"));
//! let scheduler = Scheduler::builder().kind("hello", hello.clone()).build()?;
//! let process = scheduler.handle().spawn(Spawnable::kind("hello"), "main")?;
//! let result = process.join()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! From the top down (a file uses only the files of its own item and of those below):
//!
//! - `runtime.rs`: [`Runtime`] (load, compile once, check the world) and [`Program`];
//!   `inspect.rs`: [`Runtime::inspect`], what a program is, without running it;
//! - `component.rs`: [`Component`], a guest of the `process` world ready to instantiate;
//!   `wasi.rs`: unmodified WASI programs ([`WasiProgram`]) run as one-step processes
//!   ([`WasiProcess`], granted what their [`WasiOptions`] say);
//! - `process.rs`: [`WasmProcess`], a store and an instance stepped by the scheduler;
//!   `waiting.rs`: the `wait` host function, a step ended inside the guest's `step`;
//! - `store.rs`: what a store holds (WASI with nothing granted, host imports), its
//!   limits, how it is made and fuelled; `watch.rs`: what stops or preempts a guest's
//!   call at an epoch tick (time slice, CPU budget, terminate);
//! - `engine.rs`: the one engine per runtime (on-demand instances, bounds checks,
//!   epochs); `memory.rs`: the arena every process's linear memory is a slot of;
//!   `image.rs`: large initial memory images, taken out at load and mapped copy-on-write;
//!   `stacks.rs`: the arena of the fibers' stacks;
//! - `limits.rs`: what is compiled, bounded before compiling; `cache.rs`: compiled
//!   components on disk; `precompiled.rs`: files made by `wasmproc compile`
//!   ([`Runtime::precompile`]); `key.rs`: this user's secret key, which authenticates
//!   both; `owned.rs`: reading files only this user can have written, as ssh does;
//! - `config.rs`: [`Config`], the settings and their defaults; `log.rs`: guest logs and
//!   output, tagged with the pid; `bindings.rs`: the WIT types, generated;
//!   `convert.rs`: the one place they are mapped to and from the host's.
//!
//! # Sandbox
//!
//! A process gets WASI p2 with nothing granted: no files, environment, arguments or
//! network; its stdout and stderr go to the log. It may use at most its memory cap
//! ([`Config::max_memory`]); past it the growth traps, with an error that names the
//! limit, and only that process ends. A step that runs past its time slice
//! ([`Config::time_slice`]), or past the next epoch tick while other processes wait, is
//! preempted: suspended on its fiber and queued behind the processes waiting, so a
//! looping guest costs others about a tick per turn; a CPU or fuel budget
//! ([`Config::cpu_budget`], [`Config::fuel`]) ends it. WASI programs' one long call is
//! preempted the same way. `init` cannot be
//! preempted and has a limit of its own ([`Config::init_time_limit`]).

mod bindings;
mod cache;
mod component;
mod config;
mod convert;
mod declared;
mod engine;
mod hibernate;
mod image;
mod input;
mod inspect;
mod key;
mod limits;
mod log;
mod memory;
mod output;
mod owned;
mod precompiled;
mod process;
mod runtime;
mod spare;
mod stacks;
mod store;
mod waiting;
mod wasi;
mod watch;

pub use cache::{CacheEntry, CompiledCache, Evicted};
pub use component::Component;
pub use config::Config;
pub use config::{
    DEFAULT_INIT_TIME_LIMIT, DEFAULT_MAX_CACHE_SIZE, DEFAULT_MAX_CORE_INSTANCES, DEFAULT_MAX_FUNCTION_SIZE,
    DEFAULT_MAX_FUNCTIONS, DEFAULT_MAX_INSTANCES, DEFAULT_MAX_MEMORIES, DEFAULT_MAX_MEMORY, DEFAULT_MAX_MODULE_SIZE,
    DEFAULT_MAX_TABLE_ELEMENTS, DEFAULT_MAX_TABLES, DEFAULT_TIME_SLICE,
};
pub use declared::Declared;
pub use inspect::{Inspection, ProgramKind};
pub(crate) use log::tracing_sink;
pub use log::{Escaped, Level, LogRecord, LogSink, LogSource};
pub use process::{InitRefused, WasmProcess};
pub use runtime::{HibernationStats, LoadStats, PROGRAM_START, Program, Runtime, check_start};
pub use wasi::{COMMAND_ENTRY, WasiOptions, WasiProcess, WasiProgram, exit_code};
