//! Wasm processes: components of the `wasmproc:process/process@0.1.0` world (see `wit/`)
//! run as [`Process`](crate::Process)es.
//!
//! ```no_run
//! use wasmproc::Scheduler;
//! use wasmproc::wasm::{Config, Runtime};
//!
//! let runtime = Runtime::new(Config::default())?;
//! let hello = runtime.load("hello.wasm")?;
//! println!("entries: {}", hello.entries().join(", "));
//! let scheduler = Scheduler::builder().kind("hello", hello.clone()).build()?;
//! let process = scheduler.spawn_kind("hello", "main", vec![])?;
//! println!("{:?}", process.join());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - `config.rs`: [`Config`], the settings and their defaults;
//! - `engine.rs`: the one engine per runtime (on-demand instances, bounds checks, epochs);
//! - `memory.rs`: the arena every process's linear memory is a slot of;
//! - `runtime.rs`: [`Runtime`] (load, compile once, check the world) and [`Component`];
//! - `limits.rs`: what is compiled, bounded before compiling;
//! - `cache.rs`: compiled components on disk;
//! - `precompiled.rs`: files made by `wasmproc compile` ([`Runtime::precompile`]);
//! - `key.rs`: this user's secret key, which authenticates both;
//! - `owned.rs`: reading files only this user can have written, as ssh does;
//! - `command.rs`: unmodified WASI programs ([`Command`]) run as one-step processes;
//! - `process.rs`: [`WasmProcess`], a store and an instance stepped by the scheduler;
//! - `state.rs`: what a store holds: WASI with nothing granted, host imports, limits;
//! - `log.rs`: guest logs and output, tagged with the pid;
//! - `convert.rs`, `bindings.rs`: the WIT types, generated, and their conversions.
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
//! ([`Config::cpu_budget`], [`Config::fuel`]) ends it. WASI commands' one long call is
//! preempted the same way. `init` cannot be
//! preempted and has a limit of its own ([`Config::init_time_limit`]).

mod bindings;
mod cache;
mod command;
mod config;
mod convert;
mod engine;
mod key;
mod limits;
mod log;
mod memory;
mod owned;
mod precompiled;
mod process;
mod runtime;
mod stacks;
mod state;

pub use command::{COMMAND_ENTRY, Command, CommandOptions, CommandProcess, exit_code};
pub use config::Config;
pub use log::{Level, LogRecord, LogSink, LogSource};
pub use process::WasmProcess;
pub use runtime::{Component, Inspection, LoadStats, Program, ProgramKind, Runtime};
