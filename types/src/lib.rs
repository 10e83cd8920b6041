//! The values that cross wasmproc's Wasm boundary, one Rust type each, shared by the host
//! (`wasmproc`) and the guest SDK (`wasmproc-guest`), which re-export them.
//!
//! - [`Pid`]: a process id; a `u64` in WIT.
//! - [`Payload`]: bytes plus their [`Format`]: inputs, results, message bodies; the WIT
//!   `payload` record, whose format is a string ([`Format::as_str`], [`Format::from_name`]).
//! - [`Level`]: how important a log line is; the WIT `level` enum.
//! - [`ErrorCode`]: what kind of failure a command met, the first word of its error
//!   string.
//! - [`ExitReason`]: why a process ended (normal, error, trap, killed, …); the WIT
//!   `exit-reason` variant.
//!
//! And the formats both sides write and read:
//!
//! - [`commands`]: the `wasmproc:commands` custom section, in which a component declares
//!   the commands it yields (the SDK's `uses!` writes it, the host reads it);
//! - [`leb128`]: the variable-length integers of that section and of the host's own
//!   encodings.
//!
//! The WIT types themselves are generated on each side of the boundary; each side maps
//! them to and from these (the host in `wasm/convert.rs`, the SDK in `component.rs`).
//!
//! ```
//! use wasmproc_types::{Format, Payload, Pid};
//!
//! let body = Payload::u64(7);
//! assert_eq!((body.format.as_str(), body.to_u64()), ("bytes", Some(7)));
//! assert_eq!(Format::from_name("cbor").as_str(), "cbor");
//! assert_eq!(Pid::from_u64(3).to_string(), "3");
//! ```
//!
//! # Features
//!
//! None is on by default, and without them the crate has no dependencies.
//!
//! - `serde`: `Serialize` and `Deserialize` for [`Pid`] (a plain number), and the
//!   [`supervisor`] spec's parts, which the host reads and the SDK writes.
//! - `json` (implies `serde`): `Payload::json`, `Payload::parse_json` and
//!   `Payload::decode`, through `serde_json`.

#![no_std]
#![deny(missing_docs)]

extern crate alloc;

pub mod commands;
mod error_code;
mod exit;
mod format;
#[cfg(feature = "json")]
mod json;
pub mod leb128;
mod level;
mod payload;
mod pid;
#[cfg(feature = "serde")]
pub mod supervisor;

pub use crate::error_code::ErrorCode;
pub use crate::exit::{ExitReason, Trap, TrapKind};
pub use crate::format::Format;
#[cfg(feature = "json")]
pub use crate::json::DecodeError;
pub use crate::level::Level;
pub use crate::payload::Payload;
pub use crate::pid::Pid;
