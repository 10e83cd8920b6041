//! `time.now` and `random.bytes`: the wall clock and randomness as commands.
//!
//! A Wasm process can read both through WASI as well; as commands their answers are
//! completions, so a durable process records them and reads the same values when it is
//! replayed, whatever runtime it was written in.
//!
//! - `time.now {}` → `{"unix_nanos": n}`, the host's wall clock;
//! - `random.bytes {"count": n}` → `n` bytes from the operating system's generator, as
//!   a `bytes` payload; at most [`MAX_RANDOM_BYTES`] at once.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use super::{ErrorCode, Failure, Provider, answer, input, unknown};
use crate::Payload;
use crate::handler::Request;

/// The most bytes one `random.bytes` returns: enough for keys and nonces, small enough
/// that the command cannot be used to make the host copy megabytes.
pub const MAX_RANDOM_BYTES: usize = 64 << 10;

/// The `time` provider.
#[derive(Clone, Copy, Default)]
pub struct Time;

impl Provider for Time {
    fn family(&self) -> &str {
        "time"
    }

    fn handle(&self, request: Request<'_>) {
        let outcome = match request.name() {
            "time.now" => {
                // A clock before 1970 reads as 1970 rather than failing the command.
                let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
                answer(Ok(serde_json::json!({ "unix_nanos": nanos })))
            }
            name => answer::<()>(Err(unknown(name, "time", &["now"]))),
        };
        request.complete(outcome);
    }

    fn reads_only(&self, _: &str) -> bool {
        true
    }
}

/// The `random` provider.
#[derive(Clone, Copy, Default)]
pub struct Random;

#[derive(Deserialize)]
struct Count {
    count: usize,
}

impl Provider for Random {
    fn family(&self) -> &str {
        "random"
    }

    fn handle(&self, request: Request<'_>) {
        let outcome = match request.name() {
            "random.bytes" => random_bytes(request.name(), request.payload()).map_err(String::from),
            name => answer::<()>(Err(unknown(name, "random", &["bytes"]))),
        };
        request.complete(outcome);
    }

    fn reads_only(&self, _: &str) -> bool {
        true
    }
}

fn random_bytes(name: &str, payload: &Payload) -> Result<Payload, Failure> {
    let Count { count } = input(name, payload)?;
    if count > MAX_RANDOM_BYTES {
        return Err(Failure::new(
            ErrorCode::Limit,
            format!("`random.bytes` returns at most {MAX_RANDOM_BYTES} bytes at once, not {count}"),
        ));
    }
    let mut bytes = vec![0; count];
    getrandom::fill(&mut bytes)
        .map_err(|e| Failure::new(ErrorCode::Unavailable, format!("the system's generator failed: {e}")))?;
    Ok(Payload::bytes(bytes))
}
