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
//! [`StepOutput`], [`Command`]…, `step.rs`), the limits (`limits.rs`), the
//! [`Capabilities`] a process yields under (`caps.rs`), so that the journal records them
//! and the Wasm processes are written against them without naming the scheduler; and
//! the embedder's handler API ([`crate::handler`]), whose requests and completers reach
//! the yielding process through traits its cell implements (`completer.rs`).
//!
//! - `state.rs`: the per-process state word and the wakeup protocol (read it first);
//! - `cell.rs`: one process as the scheduler holds it, and the worker's turn (the loom
//!   models live here);
//! - `inbox.rs`: the per-process inbox (MPSC event queue, mailbox bound, watchers);
//! - `worker.rs`: the worker loop (local deque, global injector, stealing, hibernation,
//!   suspension);
//! - `suspension.rs`: which waiting durable processes leave memory, and when (they come
//!   back through `recovery::bring_back`);
//! - `idle.rs`: searching and parked workers;
//! - `shared.rs`: what every thread of a scheduler shares, and queueing a process;
//! - `message.rs`: a message's trip, from its sender's checks to a mailbox or the cluster;
//! - `lifecycle.rs`: spawn, monitor, terminate, retire, drain;
//! - `links.rs`: links, exit signals and `demonitor` (what propagates, what traps);
//! - `dispatch.rs`: carrying out yields; `commands.rs`: finding a custom command's
//!   handler;
//! - `completer.rs`: answering a yield, now or later (the cell's side of the handler
//!   API); `timer.rs`: the `sleep` command;
//! - `requests.rs`: commands a process serves ([`Handle::forward`], [`Port::respond`]);
//! - `registry.rs`: pid → process;
//! - `remote.rs`: the seam to the cluster, what names a process of another node;
//!   `for_cluster.rs`: what the scheduler does for the cluster;
//! - `durable.rs`: a journal's write-ahead of steps; `recovery.rs`: resuming from it
//!   (the records, reading them back and the journal's public API are
//!   [`crate::journal`]'s: the scheduler imports the journal, never the other way);
//! - `builder.rs`, `handle.rs`, `process_handle.rs`, `stats.rs`: the public API around
//!   [`Scheduler`];
//! - `shutdown.rs`: the [`Scheduler`] itself, and how it stops (read its module docs).
//!
//! # Who imports whom
//!
//! Below the scheduler's circle (next paragraph), importing none of it: `state.rs`,
//! `inbox.rs`, `slot.rs`, `idle.rs`, `hibernation.rs`, `suspension.rs`, `stats.rs`, and the parts the
//! scheduler holds, each generic over what it holds or naming only what lies outside the
//! scheduler: `timer.rs` (what a sleep completes), `registry.rs` (what it registers),
//! `requests.rs` and `remote.rs` (the handler API's completers), `commands.rs` and
//! `process_handle.rs`.
//!
//! One circle of files that import each other is left, around the cell's back-pointer:
//! a process's cell holds its scheduler (`Shared`, in `Spec::scheduler`) so that
//! whoever completes its yield or sends it a message, on any thread, can queue it; and
//! the scheduler holds every cell (its run queues, LIFO slots and registry). Its files:
//! - `cell.rs` and `shared.rs`, the two ends of that pointer;
//! - `worker.rs`: a process woken on a worker goes into that worker's LIFO slot, which
//!   `Shared::schedule` finds through the thread's worker (`worker::push_local`), and the
//!   worker runs the cells the scheduler queues;
//! - `durable.rs`: the scheduler holds the journal's committer, whose committed items
//!   hold cells and carry out a step's effects through their back-pointer, on the
//!   committer's thread (`AfterCommit::carry_out`); and a durable process's port sends
//!   are kept for its step only while the worker is in that step (`worker::is_stepping`);
//! - `recovery.rs` and `completer.rs`: a suspended process comes back on the worker that
//!   runs its next event (`recovery::bring_back`), replayed from its journal, its
//!   pending commands given completers again. (Untying this is open work.)
//!
//! Above the circle, importing it and imported by none of it: `dispatch.rs`,
//! `lifecycle.rs`, `links.rs`, `message.rs`, `handle.rs`, `for_cluster.rs`, `builder.rs`
//! and `shutdown.rs`. Most are methods of `Shared` or of
//! [`Handle`], which the circle calls without importing their files (the worker ends a
//! turn with `Shared::dispatch_from` and `Shared::end`).

mod builder;
pub(crate) use crate::caps;
mod cell;
mod commands;
mod completer;
mod dispatch;
mod durable;
#[cfg(feature = "cluster")]
pub(crate) use self::durable::{Receipt, unrecorded};
mod for_cluster;
mod handle;
mod hibernation;
mod idle;
mod inbox;
mod kinds;
mod lifecycle;
mod links;
mod message;
mod process_handle;
mod recorded;
mod recovery;
mod registry;
pub(crate) mod remote;
mod requests;
mod retry;
mod shared;
mod shutdown;
mod slot;
mod state;
mod stats;
mod suspension;
mod timer;
mod worker;

pub use self::builder::{
    Builder, DEFAULT_MAILBOX_BYTES, DEFAULT_MAILBOX_CAPACITY, DEFAULT_MAX_CHILDREN, DEFAULT_MAX_DESCENDANTS,
    DEFAULT_MAX_LINKS, DEFAULT_MAX_PAYLOAD_SIZE, DEFAULT_MAX_PROCESSES, DEFAULT_MAX_YIELDS_PER_STEP,
    DEFAULT_OUTPUT_PER_PAYLOAD,
};
pub use self::caps::Capabilities;
pub(crate) use self::durable::replaying_now;
pub use self::handle::{Handle, SpawnOptions, Spawnable};
pub use self::hibernation::HIBERNATE_AFTER as DEFAULT_HIBERNATE_AFTER;
pub use self::process_handle::ProcessHandle;
pub use self::recorded::Recorded;
pub use self::retry::{Retry, RetryPolicy, Retrying};
pub use self::shutdown::{Scheduler, StopReport};
pub use self::stats::{Stats, WorkerStats, YieldCounts};
pub use self::suspension::DEFAULT_SUSPEND_AFTER;
pub use crate::limits::ProcessQuota;
pub use crate::process::{Port, Process};
pub use crate::step::{Command, Event, Events, ExitSignal, Exited, Outcome, SpawnRequest, Status, StepOutput, Yield};
