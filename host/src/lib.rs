//! wasmproc: a host that runs many untrusted processes on a work-stealing scheduler.
//!
//! A *process* is a state machine that the host steps: each step consumes events
//! (completions of earlier commands, messages, cancellation) and yields commands (sleep,
//! spawn, send, monitor, terminate, or custom commands the embedder handles). Processes
//! never block a thread: while a command is outstanding the process is parked, and the
//! command's completion wakes it.
//!
//! ```
//! use wasmproc::{Event, Events, Payload, Port, Process, Scheduler, StepOutput};
//!
//! /// Waits for one message and answers with its body doubled.
//! struct Doubler;
//!
//! impl Process for Doubler {
//!     fn init(&mut self, _port: Port, method: &str, _input: Vec<Payload>) -> anyhow::Result<()> {
//!         anyhow::ensure!(method == "main", "unknown method `{method}`; entries: main");
//!         Ok(())
//!     }
//!
//!     fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
//!         for event in events {
//!             if let Event::Message { body, .. } = event {
//!                 let n = body.to_u64().unwrap_or(0);
//!                 out.complete(Ok(Payload::u64(n * 2)));
//!                 return Ok(());
//!             }
//!         }
//!         out.set_status(wasmproc::Status::Idle);
//!         Ok(())
//!     }
//! }
//!
//! let scheduler = Scheduler::builder().workers(2).build()?;
//! let process = scheduler.handle().spawn(Doubler, "main")?;
//! scheduler.handle().send(process.pid(), "n", Payload::u64(21))?;
//! assert_eq!(process.join()?.to_u64(), Some(42));
//! scheduler.stop(std::time::Duration::from_secs(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Core concepts
//!
//! The root holds what a process is written against; five modules hold the rest.
//!
//! - [`Scheduler`]: owns the worker threads (one per core by default), each with a local
//!   LIFO deque, plus a global FIFO queue and work stealing. Costly to build (starts
//!   threads); build one per host. [`Scheduler::stop`] shuts it down gracefully.
//! - [`Handle`]: a cheap, clonable reference to the scheduler for spawning (one
//!   [`Handle::spawn`], taking a process or a kind and its options), sending and
//!   terminating from any thread, including command handlers.
//! - [`Process`]: what the scheduler runs: `init` (choose an entry method), `step`, `close`,
//!   and optionally `hibernate` (give memory back while waiting, when the workers are
//!   idle). Implement it natively, or load a Wasm component.
//! - [`Port`]: handed to each process at `init`: its pid, `send` as itself during a step,
//!   and whether a long step should yield. Cheap to clone; holds its process weakly.
//!   Every message, through a port or a yielded `send`, takes one checked path.
//! - [`Pid`], [`Payload`], [`Format`]: the values that cross the Wasm boundary, the same
//!   types in the host and the guest SDK (crate `wasmproc-types`).
//! - [`Event`] / [`Events`] / [`StepOutput`] / [`Command`]: what flows into and out of a step.
//! - [`Capabilities`]: the commands a process may use; custom ones are denied by default.
//! - [`scheduler`]: the builder and its limits (process count, mailbox bound; more
//!   per-process limits apply to Wasm processes), spawn options, stats.
//! - [`handler`]: custom commands and how they answer, now or later; process kinds.
//! - [`error`]: the errors callers match on.
//! - [`provider`]: families of commands that do real I/O (HTTP, key-value, files,
//!   environment, time and randomness), each denied until granted.
//! - [`supervisor`]: the built-in kind `supervisor`, a supervision tree described as data
//!   ([`supervisor::SupervisorSpec`]): OTP's strategies, restart intensity, backoff.
//! - [`journal`]: durable processes: a journal given to the builder records every
//!   process's history ahead of its effects, and a scheduler built on it again resumes
//!   the unfinished ones; [`journal::Journal`] reads what it holds ([`journal::History`],
//!   [`journal::HeldRun`]).
//! - [`cluster`] (feature `cluster`, on by default): nodes joined through a NATS server;
//!   a pid names its node, and whatever names another node goes there (`Cluster`: one a
//!   host, a thread of its own for the network).
//! - [`wasm`] (feature `wasm`, on by default): one wasmtime engine, its instance memory and
//!   fiber-stack arenas and the compile caches (`wasm::Runtime`; costly to build, one per
//!   host). `Runtime::load` gives a `wasm::Component`: cheap to clone, and a
//!   [`Factory`](handler::Factory) to register as a process kind. Each of its processes is
//!   a `wasm::WasmProcess`: one store and instance, sandboxed by a memory cap, with steps
//!   preempted at each time slice.

#![deny(missing_docs)]

mod caps;
#[cfg(feature = "cluster")]
pub mod cluster;
mod codec;
pub mod error;
pub mod handler;
pub mod heap;
pub mod journal;
mod limits;
mod loom;
mod process;
pub mod provider;
pub mod scheduler;
/// The long-lived service: workflows of many tenants over one data directory, and its
/// HTTP API.
#[cfg(feature = "serve")]
pub mod serve;
mod step;
pub mod supervisor;
#[cfg(test)]
mod testing;
#[cfg(feature = "wasm")]
pub mod wasm;

pub use process::{Port, Process};
pub use scheduler::{Capabilities, Handle, Scheduler};
pub use step::{Command, Event, Events, ExitSignal, Exited, Outcome, SpawnRequest, Status, StepOutput, Yield};
pub use wasmproc_types::{ExitReason, Format, Payload, Pid, Trap, TrapKind};
