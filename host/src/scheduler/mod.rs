//! The work-stealing process scheduler and the interface of the processes it runs.
//!
//! Build a [`Scheduler`] with [`Scheduler::builder`]; spawn and message processes through
//! its [`Handle`]; each process gets a [`Port`] at `init`. The [`Process`] trait and the
//! values of a step ([`Event`], [`StepOutput`], [`Command`]…) are re-exported at the crate
//! root.
//!
//! # Inside, one concern a file
//!
//! Below the scheduler, in files that name nothing of it: the [`Process`] trait and its
//! [`Port`] (the crate's `process.rs`), what flows into and out of a step ([`Event`],
//! [`StepOutput`], [`Command`]…, `step.rs`), the limits (`limits.rs`) and the
//! [`Capabilities`] a process yields under (`caps.rs`), so that the journal records them
//! and the Wasm processes are written against them without naming the scheduler.
//!
//! - `state.rs`: the per-process state word and the wakeup protocol (read it first);
//! - `cell.rs`: one process as the scheduler holds it, and the worker's turn (the loom
//!   models live here);
//! - `inbox.rs`: the per-process inbox (MPSC event queue, mailbox bound, watchers);
//! - `worker.rs`: the worker loop (local deque, global injector, stealing, hibernation);
//! - `idle.rs`: searching and parked workers;
//! - `shared.rs`: what every thread of a scheduler shares, and queueing a process;
//! - `message.rs`: a message's trip, from its sender's checks to a mailbox or the cluster;
//! - `lifecycle.rs`: spawn, monitor, terminate, retire, drain;
//! - `dispatch.rs`: carrying out yields, and the embedder's
//!   [`Handler`](crate::handler::Handler)s and [`Factory`](crate::handler::Factory)s;
//! - `completer.rs`: answering a yield, now or later; `timer.rs`: the `sleep` command;
//! - `requests.rs`: commands a process serves ([`Handle::forward`], [`Port::respond`]);
//! - `registry.rs`: pid → process;
//! - `remote.rs`: what names a process of another node goes to the cluster;
//! - `durable.rs`: a journal's write-ahead of steps; `recovery.rs`: resuming from it
//!   (the records, reading them back and the journal's public API are
//!   [`crate::journal`]'s: the scheduler imports the journal, never the other way);
//! - `builder.rs`, `handle.rs`, `stats.rs`: the public API around [`Scheduler`];
//! - `shutdown.rs`: the [`Scheduler`] itself, and how it stops (read its module docs).
//!
//! # Who imports whom
//!
//! Below the scheduler's files, and importing none of them: `state.rs`, `inbox.rs`,
//! `slot.rs`, `idle.rs`, `hibernation.rs`, `stats.rs` and `timer.rs` (which wakes a
//! parameter, the yield's completer, not a process). Above the circle below, importing
//! it and imported by none of it: `builder.rs`, `recovery.rs` and `shutdown.rs`; and
//! `message.rs`, methods of the scheduler that the circle calls without importing.
//!
//! In between, one circle of files that import each other, around the cell's
//! back-pointer: a process's cell holds its scheduler (`Shared`, in `Spec::scheduler`) so
//! that whoever completes its yield or sends it a message, on any thread, can queue it;
//! and the scheduler holds every cell (its run queues and `registry.rs`). `cell.rs`,
//! `shared.rs`, `worker.rs` (a woken cell goes into the waking worker's LIFO slot, a
//! completion made during dispatch into its buffer) and `completer.rs` (a completer holds
//! the cell it answers, and cells' watchers hold completers) share that pointer by
//! nature. The others of the circle are in it because the scheduler holds them and they
//! name a cell, a completer or a [`Handle`]: the registry, the handlers and their
//! requests (`dispatch.rs`, `requests.rs`), the cluster's remote (`remote.rs`), the
//! journal's committer (`durable.rs`), and the embedder's handle (`handle.rs`, whose
//! exit slots cells' watchers hold), with spawning and ending (`lifecycle.rs`, methods of
//! the scheduler that dispatch calls). Each could leave it as `timer.rs` did, generic over
//! what it holds, where that pays.

mod builder;
pub(crate) use crate::caps;
mod cell;
pub(crate) mod completer;
pub(crate) mod dispatch;
mod durable;
mod handle;
mod hibernation;
mod idle;
mod inbox;
mod lifecycle;
mod message;
mod recovery;
mod registry;
pub(crate) mod remote;
mod requests;
mod shared;
mod shutdown;
mod slot;
mod state;
mod stats;
mod timer;
mod worker;

pub use self::builder::{
    Builder, DEFAULT_MAILBOX_BYTES, DEFAULT_MAILBOX_CAPACITY, DEFAULT_MAX_CHILDREN, DEFAULT_MAX_DESCENDANTS,
    DEFAULT_MAX_PAYLOAD_SIZE, DEFAULT_MAX_PROCESSES, DEFAULT_MAX_YIELDS_PER_STEP, DEFAULT_OUTPUT_PER_PAYLOAD,
};
pub use self::caps::Capabilities;
pub(crate) use self::durable::replaying_now;
pub use self::handle::{Handle, ProcessHandle, SpawnOptions, Spawnable};
pub use self::shutdown::{Scheduler, StopReport};
pub use self::stats::{Stats, WorkerStats, YieldCounts};
pub use crate::process::{Port, Process};
pub use crate::step::{Command, Event, Events, Outcome, SpawnRequest, Status, StepOutput, Yield};
