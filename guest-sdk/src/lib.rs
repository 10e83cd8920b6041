//! Write wasmproc processes in Rust.
//!
//! A process is an `async fn` marked [`#[entry]`](entry): it gets a [`Ctx`] and a
//! JSON-decoded input, and returns a `Result` whose value becomes its JSON result (its
//! error, with the whole chain of causes, becomes its error result). Anything that waits,
//! such as sleeping, spawning, receiving or calling the embedder, is an `.await` on a
//! [`Ctx`] method, and several can be in flight at once through [`join_all`], [`join`],
//! [`select`] and [`select_any`]. One line, [`export!`], turns a crate's entries into a
//! component.
//!
//! ```
//! use wasmproc_guest::prelude::*;
//!
//! /// Squares `0..n` in child processes, one each.
//! #[entry]
//! async fn fan_out(ctx: Ctx, n: u64) -> Result<Vec<u64>> {
//!     // Typed: `square::spawn` takes a `u64`, and its child's `join` gives a `u64`.
//!     let children = join_all((0..n).map(|i| square::spawn(&ctx, i))).await?;
//!     let squares = join_all(children.into_iter().map(|child| child.join())).await?;
//!     ctx.timeout(Duration::from_secs(1), ctx.recv_topic("thanks")).await.ok();
//!     log::info!("squared {n} numbers");
//!     Ok(squares)
//! }
//!
//! #[entry]
//! async fn square(_ctx: Ctx, i: u64) -> Result<u64> {
//!     Ok(i * i)
//! }
//!
//! wasmproc_guest::export!(fan_out, square);
//! # fn main() {}
//! ```
//!
//! Build such a crate as a `cdylib` for `wasm32-wasip2`; the result is a component of the
//! world `wasmproc:process/process`, ready for the host to load.
//!
//! # Errors
//!
//! What the host refuses or reports is an [`Error`]: match on what you can handle
//! ([`Error::MailboxFull`], [`Error::NoProc`], [`Error::Cancelled`], a command's
//! [`ErrorCode`]…) and pass the rest on with `?`; an entry returns `anyhow::Result`, so
//! its own failures need no type of their own.
//!
//! # Cancellation
//!
//! When the host cancels a process (shutdown, `wasmproc run --timeout`), every wait in it
//! fails with [`Error::Cancelled`] from then on, sleeps, receives, waits for children
//! and commands alike, unless what it waited for had already arrived. An entry that
//! propagates errors with `?` thus finishes promptly by itself; one that must tidy up
//! can still [`Ctx::send`], which does not wait.
//!
//! # Logging
//!
//! The SDK makes the host's log the backend of the [`log`](https://docs.rs/log) crate:
//! `log::info!` and its siblings in a guest write there, tagged with the process's pid,
//! as [`Ctx::log`] does.
//!
//! # Workflows of `wasmproc serve`
//!
//! A process the service started as a workflow (and every process it spawns) knows the
//! workflow's id ([`Ctx::workflow_id`]); its root process takes the requests callers send
//! it ([`Ctx::next_workflow_request`]) and answers each with
//! [`WorkflowRequest::respond`] while the caller waits; and [`Ctx::recv_signal`] receives
//! a signal's JSON body as a serde type. The contract is the same as for any process: the
//! id arrives as a payload of format `wasmproc-workflow-id` after the entry's input (the
//! SDK takes it out, and passes it on to the children it spawns), a request as a message
//! from the host on topic `wasmproc:request:ID:TOPIC`, and an answer leaves as the custom
//! command `workflow.answer`, which the service records before the caller sees it.
//!
//! ```
//! use wasmproc_guest::prelude::*;
//!
//! #[derive(serde::Deserialize)]
//! struct Add {
//!     by: u64,
//! }
//!
//! /// Answers `get` with the count; the signal `add` adds to it.
//! #[entry]
//! async fn counter(ctx: Ctx, start: u64) -> Result<u64> {
//!     let mut count = start;
//!     log::info!("counting in workflow {}", ctx.workflow_id().unwrap_or("(none)"));
//!     loop {
//!         match select(ctx.next_workflow_request(), ctx.recv_signal::<Add>("add")).await {
//!             Either::Left(request) => request?.respond(Ok::<_, Error>(count)).await?,
//!             Either::Right(Ok(add)) => count += add.by,
//!             Either::Right(Err(Error::Payload(why))) => log::warn!("{why}"),
//!             Either::Right(Err(other)) => return Err(other.into()),
//!         }
//!     }
//! }
//!
//! wasmproc_guest::export!(counter);
//! # fn main() {}
//! ```
//!
//! # How it runs
//!
//! The host drives a process in steps. `init` decodes the input and creates the entry's
//! future; each `step` hands the process the events that arrived (completions of its
//! commands, messages, exits of processes it monitors, cancellation) and polls the future
//! until it can go no further. The commands it reached go back to the host as yields,
//! with the status: complete, blocked on commands, idle waiting for messages, or continue
//! while commands past the host's per-step limit wait their turn (they go out in the
//! following steps, so `join_all` over 100,000 spawns just works). A send is no command:
//! it goes through the host's `send` function at once and costs no step. The SDK
//! contains that executor; it needs no async runtime, no threads and no clock.
//!
//! Until the entry completes, the process does not return from `step`: it ends each step
//! in the host's `wait` function (`wasmproc:process@0.2.1`), which hands the host the
//! step's yields and status and answers with the next step's events, so a process that
//! exchanges messages costs no call of `step` a message. A host that keeps a process
//! waiting long tells it to return, and the next step calls `step` afresh.

#![deny(missing_docs)]

// The guest's global allocator: in a guest only (and in the SDK's tests of it).
#[cfg(any(test, all(feature = "allocator", target_arch = "wasm32", not(target_feature = "atomics"))))]
mod alloc;
mod combinators;
mod component;
mod ctx;
mod error;
mod executor;
mod host;
mod logger;
mod payload;
mod providers;
mod service;
pub mod supervisor;

pub use anyhow;

pub use crate::combinators::{Either, Join, JoinAll, Select, SelectAny, join, join_all, select, select_any};
pub use crate::ctx::{Cancellation, Child, Completion, Ctx, ExitOf, Recv, RecvExit, Spawn, Timeout, Wait};
pub use crate::error::{Error, ErrorCode};
pub use crate::payload::{DecodeError, ExitReason, Format, Level, LinkedExit, Message, Payload, Pid, Trap, TrapKind};
pub use crate::providers::{
    DirEntry, Fs, Http, Keys, Kv, NextRequest, Request as HttpRequest, Response, ServeRequest, Versioned,
};
pub use crate::service::{NextWorkflowRequest, RecvSignal, WorkflowRequest};

/// Makes an `async fn` an entry method of the component.
///
/// The function must have the shape `async fn name(ctx: Ctx, input: T) -> Result<R>`:
///
/// - `T` is decoded from the first input payload (JSON; `null` when the spawner gave no
///   input, so `()` and `Option<_>` inputs may be left out). An input that does not
///   decode fails the spawn, naming the method.
/// - `R` is serialised as the process's JSON result; an error becomes the error result,
///   formatted with its causes (`{:#}`). The error type may be anything that converts
///   into `anyhow::Error`.
/// - The method's name is the function's name. List the function in [`export!`].
///
/// The function stays callable as written. The attribute adds a module of the same name
/// beside it, which is why entries must be items of a module, not of a function body. The
/// module's `spawn` starts the entry in a child process, typed by the signature:
/// `name::spawn(&ctx, input: T)` resolves to a [`Child<R>`](Child), whose
/// [`join`](Child::join) resolves to the child's `R`. (`spawn` needs `T: Serialize`;
/// an entry whose input only deserialises is still an entry, it is only spawned by name
/// with [`Ctx::spawn`].)
///
/// ```
/// use wasmproc_guest::prelude::*;
///
/// #[entry]
/// async fn tally(ctx: Ctx, words: Vec<String>) -> Result<usize> {
///     let child = count::spawn(&ctx, words.join(" ")).await?;
///     Ok(child.join().await?)
/// }
///
/// #[entry]
/// async fn count(_ctx: Ctx, text: String) -> Result<usize> {
///     Ok(text.split_whitespace().count())
/// }
///
/// wasmproc_guest::export!(tally, count);
/// # fn main() {}
/// ```
/// Mistakes in the signature are compile errors at the offending tokens:
///
/// ```compile_fail
/// use wasmproc_guest::prelude::*;
///
/// #[entry]
/// fn not_async(ctx: Ctx, n: u32) -> Result<u32> { // error: an entry must be an `async fn`
///     Ok(n)
/// }
/// # fn main() {}
/// ```
///
/// ```compile_fail
/// use wasmproc_guest::prelude::*;
///
/// #[entry]
/// async fn no_ctx(n: u32) -> Result<u32> { // error: an entry takes two arguments, ...
///     Ok(n)
/// }
/// # fn main() {}
/// ```
pub use wasmproc_guest_macros::entry;

/// Declares the commands the component yields, so that `wasmproc inspect` can list them
/// with the grant each needs before anything runs.
///
/// Name each command the component's code can yield: a built-in (`"sleep"`, `"spawn"`,
/// `"monitor"`, `"terminate"`), a provider's command (`"kv.get"`, `"http.request"`,
/// `"inventory.reserve"`), or a whole family (`"kv.*"`). The wrappers' commands are
/// those their docs name: [`Ctx::http`] yields `http.request`, [`Ctx::kv`] `kv.get`,
/// `kv.put`, `kv.cas`, `kv.delete` and `kv.list`, [`Ctx::fs`] `fs.read`, `fs.write`,
/// `fs.list` and `fs.remove`, [`Ctx::env`] `env.get`, [`Ctx::now`] `time.now`,
/// [`Ctx::random_bytes`] `random.bytes`. Sends and answering requests as a provider are
/// no commands. `uses!()` with no names declares that the component yields none.
///
/// Names after an entry method and a colon, `uses!(fetch: "http.request")`, are the
/// commands that entry method yields (rather than every one), so that `wasmproc run
/// --method fetch` warns only of what `fetch` needs; `inspect` shows which entry methods
/// declare each command. A host older than this form skips such declarations.
///
/// The declaration is what the author states, not something the SDK infers: the SDK
/// cannot record the wrappers a component calls, because whatever a wrapper carries in
/// the binary is linked in whether or not it is called. It grants nothing either: the
/// host still checks every command against the process's grants. Invoke it at module
/// level, usually once per component; several invocations, also in libraries the
/// component links, add up. A name that is not a command name, or one named twice, is a compile
/// error at the offending literal.
///
/// ```
/// use wasmproc_guest::prelude::*;
///
/// #[entry]
/// async fn fetch(ctx: Ctx, url: String) -> Result<u64> {
///     let response = ctx.http().get(&url).await?;
///     ctx.kv().put("last-status", &response.status).await?;
///     ctx.sleep(Duration::from_millis(10)).await?;
///     Ok(response.body.len() as u64)
/// }
///
/// wasmproc_guest::export!(fetch);
/// wasmproc_guest::uses!("sleep");
/// wasmproc_guest::uses!(fetch: "http.request", "kv.put");
/// # fn main() {}
/// ```
///
/// ```compile_fail
/// wasmproc_guest::uses!("kv get"); // error: `kv get` is not a command name: ...
/// # fn main() {}
/// ```
pub use wasmproc_guest_macros::uses;

/// What a process module usually needs: `use wasmproc_guest::prelude::*;`.
pub mod prelude {
    pub use std::time::Duration;

    pub use anyhow::{Context as _, Result, anyhow, bail, ensure};

    pub use crate::{
        Ctx, Either, Error, ExitReason, Format, Level, LinkedExit, Message, Payload, Pid, TrapKind, entry, join,
        join_all, select, select_any,
    };
}

/// Exports the listed [`entry`] functions as the component's entry methods, in the
/// order given (the order `entries` reports them in).
///
/// Invoke it once per component, at any module level, naming each entry by its path:
/// `wasmproc_guest::export!(main, handlers::pong);`. It implements the component's
/// exports (`entries`, `init`, `step`) on top of the SDK's executor; on targets other than
/// `wasm32` it only type-checks them.
///
/// ```
/// use wasmproc_guest::prelude::*;
///
/// mod math {
///     use wasmproc_guest::prelude::*;
///
///     #[entry]
///     pub async fn add(_ctx: Ctx, (a, b): (i64, i64)) -> Result<i64> {
///         a.checked_add(b).with_context(|| format!("{a} + {b} overflows"))
///     }
/// }
///
/// #[entry]
/// async fn hello(_ctx: Ctx, name: String) -> Result<String> {
///     Ok(format!("hello, {name}"))
/// }
///
/// wasmproc_guest::export!(hello, math::add);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! export {
    ($($($segment:ident)::+),+ $(,)?) => {
        const _: () = {
            static ENTRIES: &[$crate::__private::Entry] = &[$($($segment)::+::ENTRY),+];

            struct Process;

            impl $crate::__private::Guest for Process {
                fn entries() -> ::std::vec::Vec<::std::string::String> {
                    $crate::__private::entries(ENTRIES)
                }

                fn init(
                    pid: u64,
                    method: ::std::string::String,
                    input: ::std::vec::Vec<$crate::__private::WitPayload>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::__private::init(ENTRIES, pid, method, input)
                }

                fn step(events: ::std::vec::Vec<$crate::__private::WitEvent>) -> $crate::__private::WitStepOutput {
                    $crate::__private::step(events)
                }
            }

            #[cfg(target_arch = "wasm32")]
            $crate::__private::bindings::__export_process!(Process with_types_in $crate::__private::bindings);
        };
    };
}

/// What the macros expand to; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use serde::Serialize;

    pub use crate::component::{Entry, entries, init, start, step};
    pub use crate::ctx::{spawn_entry, spawn_link_entry};
    pub use crate::host::bindings;
    pub use crate::host::bindings::Guest;
    pub use crate::host::bindings::wasmproc::process::types::{
        Event as WitEvent, Payload as WitPayload, StepOutput as WitStepOutput,
    };
}
