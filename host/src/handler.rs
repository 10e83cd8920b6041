//! Custom commands and process kinds: what an embedder registers with
//! [`Builder::handler`](crate::scheduler::Builder::handler) and
//! [`Builder::kind`](crate::scheduler::Builder::kind).
//!
//! A [`Handler`] carries out the custom command registered under its name; each yield
//! reaches it as a [`Request`] and is answered exactly once, at once or later through its
//! [`Completer`]. A [`Factory`] makes the processes of a kind for `spawn` commands and
//! [`Spawnable::kind`](crate::scheduler::Spawnable::kind).

pub use crate::limits::KindLimits;
pub use crate::scheduler::completer::Completer;
pub use crate::scheduler::dispatch::{Factory, Handler, ReadOnly, Request};
