//! Conversions between the scheduler's values and the WIT types of the `process` world.
//!
//! Payload bytes move, never copy: a yield's payload becomes the host's (and an event's
//! body the guest-bound value, in `input.rs`), so a step copies each payload only where
//! the canonical ABI must (into and out of guest memory).

use std::time::Duration;

use wasmproc_types::{ExitReason, Format, Level, Payload, Pid, Trap};

use super::bindings::wasmproc::process::host;
use super::bindings::wasmproc::process::types as wit;
use super::output::{self, Caps};
use crate::limits::{output_limit_exceeded, payload_limit_exceeded, yield_limit_exceeded};
use crate::step::{Command, ExitSignal, Outcome, SpawnRequest, Status};

pub(crate) fn payload_to_wit(payload: Payload) -> wit::Payload {
    wit::Payload { format: payload.format.as_str().to_owned(), data: payload.data }
}

pub(crate) fn payload_from_wit(payload: wit::Payload) -> Payload {
    Payload { format: Format::from_name(&payload.format), data: payload.data }
}

/// The error of a step whose output's byte strings together passed `max_output_per_step`
/// (see `output.rs`), if it did: checked before anything else of the output, whose
/// strings past the bound were not lifted.
pub(crate) fn check_output_size(output: &output::StepOutput, caps: Caps) -> Result<(), String> {
    match output.over {
        Some(total) => Err(output_limit_exceeded(total, caps.output)),
        None => Ok(()),
    }
}

/// A name or text of a step's output, or the error for one over `max_payload_size`.
fn text_from_output(text: output::Capped<String, output::Bytes>, what: &str, caps: Caps) -> Result<String, String> {
    text.value.map_err(|len| {
        format!("payload limit exceeded: a {len}-byte {what} is over `max_payload_size` ({} bytes)", caps.bytes)
    })
}

/// The scheduler's status of a step's `status`, or the error of the limit its result
/// passed (see `output.rs`).
pub(crate) fn status_from_output(status: output::StatusKind, caps: Caps) -> Result<Status, String> {
    Ok(match status {
        output::StatusKind::Complete(Ok(payload)) => {
            let size = len_of(&payload.data, Vec::len);
            Status::Complete(Ok(payload_from_output(payload, size, "the result", caps)?))
        }
        output::StatusKind::Complete(Err(error)) => {
            Status::Complete(Err(text_from_output(error, "error result", caps)?))
        }
        output::StatusKind::Idle => Status::Idle,
        output::StatusKind::Blocked => Status::Blocked,
        output::StatusKind::Continue => Status::Continue,
    })
}

/// The yields of a step that did not complete, or the error of the limit they passed: the
/// scheduler's own errors, in the order it checks (the count, then each yield's payloads).
pub(crate) fn yields_from_output(
    yields: output::Capped<Vec<output::YieldCommand>, output::YieldCount>,
    caps: Caps,
) -> Result<impl Iterator<Item = Result<(u64, Command), String>>, String> {
    let yields = yields.value.map_err(|count| yield_limit_exceeded(count, caps.yields))?;
    Ok(yields.into_iter().map(move |y| Ok((y.tag, command_from_output(y.command, caps)?))))
}

/// `payload` as the host's, or the error for a payload that made `size` bytes handed to
/// `what` when its bytes were over the cap.
fn payload_from_output(payload: output::Payload, size: usize, what: &str, caps: Caps) -> Result<Payload, String> {
    match payload.data.value {
        Ok(data) => Ok(Payload { format: payload.format.0, data }),
        Err(_) => Err(payload_limit_exceeded(size, what, caps.bytes)),
    }
}

/// The length of a capped list or string: lifted, or as the guest wrote it when over.
fn len_of<T, K>(capped: &output::Capped<T, K>, len: impl Fn(&T) -> usize) -> usize {
    capped.value.as_ref().map_or_else(|&over| over, len)
}

/// A message's topic and body, yielded or given to the `send` host function, or the
/// error of the payload limit they passed: a topic travels with its body, and counts with
/// it (`message_size`).
pub(crate) fn message_from_output(
    topic: output::Capped<String, output::Bytes>,
    body: output::Payload,
    caps: Caps,
) -> Result<(String, Payload), String> {
    let size = len_of(&topic, String::len) + len_of(&body.data, Vec::len);
    let topic = topic.value.map_err(|_| payload_limit_exceeded(size, "send", caps.bytes))?;
    Ok((topic, payload_from_output(body, size, "send", caps)?))
}

/// A provider's answer given to `respond`, or the error of the payload limit it passed
/// (the payload's bytes and format's name together, or the error's text, as
/// `Requests::respond` counts them).
pub(crate) fn response_from_output(
    result: Result<output::Payload, output::Capped<String, output::Bytes>>,
    caps: Caps,
) -> Result<Outcome, String> {
    Ok(match result {
        Ok(payload) => {
            let size = len_of(&payload.data, Vec::len) + payload.format.0.as_str().len();
            Ok(payload_from_output(payload, size, "respond", caps)?)
        }
        Err(error) => {
            let size = len_of(&error, String::len);
            Err(error.value.map_err(|_| payload_limit_exceeded(size, "respond", caps.bytes))?)
        }
    })
}

pub(crate) fn command_from_output(command: output::Command, caps: Caps) -> Result<Command, String> {
    Ok(match command {
        output::Command::Sleep(nanos) => Command::Sleep(Duration::from_nanos(nanos)),
        output::Command::Spawn(request) => {
            let input = request.input.value.map_err(|count| {
                format!(
                    "payload limit exceeded: {count} inputs for `spawn` are more than `max_payload_size` ({})",
                    caps.bytes
                )
            })?;
            // The scheduler counts a spawn's inputs together.
            let size = input.iter().map(|p| len_of(&p.data, Vec::len)).sum();
            let input =
                input.into_iter().map(|p| payload_from_output(p, size, "spawn", caps)).collect::<Result<_, _>>();
            Command::Spawn(SpawnRequest {
                kind: request.kind.map(|kind| text_from_output(kind, "kind for `spawn`", caps)).transpose()?,
                method: text_from_output(request.method, "method for `spawn`", caps)?,
                input: input?,
                monitor: request.monitor,
                link: request.link,
            })
        }
        output::Command::Send(request) => {
            let (topic, body) = message_from_output(request.topic, request.body, caps)?;
            Command::Send { to: Pid::from_u64(request.to), topic, body }
        }
        output::Command::Monitor(pid) => Command::Monitor(Pid::from_u64(pid)),
        output::Command::Terminate(pid) => Command::Terminate(Pid::from_u64(pid)),
        output::Command::Link(pid) => Command::Link(Pid::from_u64(pid)),
        output::Command::Unlink(pid) => Command::Unlink(Pid::from_u64(pid)),
        output::Command::Demonitor(pid) => Command::Demonitor(Pid::from_u64(pid)),
        output::Command::Exit(signal) => Command::Exit(ExitSignal {
            to: Pid::from_u64(signal.to),
            reason: reason_from_output(signal.reason, caps)?,
            kill: signal.kill,
        }),
        output::Command::TrapExits(on) => Command::TrapExits(on),
        output::Command::Custom(custom) => {
            let name = text_from_output(custom.name, "command name", caps)?;
            let size = len_of(&custom.payload.data, Vec::len);
            let payload = payload_from_output(custom.payload, size, &name, caps)?;
            Command::Custom { name: name.into(), payload }
        }
    })
}

/// An exit signal's reason as the host's, or the error of the payload limit its payload
/// or text passed.
fn reason_from_output(reason: output::ExitReason, caps: Caps) -> Result<ExitReason, String> {
    let text = |text: output::Capped<String, output::Bytes>| {
        let size = len_of(&text, String::len);
        text.value.map_err(|_| payload_limit_exceeded(size, "exit", caps.bytes))
    };
    Ok(match reason {
        output::ExitReason::Normal(payload) => {
            let size = len_of(&payload.data, Vec::len);
            ExitReason::Normal(payload_from_output(payload, size, "exit", caps)?)
        }
        output::ExitReason::Error(error) => ExitReason::Error(text(error)?),
        output::ExitReason::Trap(trap) => {
            ExitReason::Trap(Trap { kind: trap.kind.into(), message: text(trap.message)? })
        }
        output::ExitReason::Killed => ExitReason::Killed,
        output::ExitReason::Shutdown => ExitReason::Shutdown,
        output::ExitReason::Terminated => ExitReason::Terminated,
        output::ExitReason::Noproc => ExitReason::Noproc,
        output::ExitReason::Noconnection(node) => ExitReason::Noconnection(text(node)?),
    })
}

pub(crate) fn level_from_wit(level: host::Level) -> Level {
    match level {
        host::Level::Trace => Level::Trace,
        host::Level::Debug => Level::Debug,
        host::Level::Info => Level::Info,
        host::Level::Warn => Level::Warn,
        host::Level::Error => Level::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_formats_round_trip_by_name() {
        for format in [Format::Json, Format::Bytes, Format::Text, Format::Other("cbor".into())] {
            let payload = Payload { format: format.clone(), data: vec![1, 2] };
            assert_eq!(payload_from_wit(payload_to_wit(payload.clone())), payload);
        }
    }

    const CAPS: Caps = Caps { yields: 4, bytes: 8, output: 32 };

    #[test]
    fn commands_keep_their_fields() {
        let command = |c| command_from_output(c, CAPS);
        assert_eq!(command(output::Command::Sleep(1_500)), Ok(Command::Sleep(Duration::from_nanos(1_500))));
        let custom = output::CustomCommand::new("db.get", output::Payload::new("text", b"k".to_vec()));
        assert_eq!(
            command(output::Command::Custom(custom)),
            Ok(Command::Custom { name: "db.get".into(), payload: Payload::text("k") })
        );
        let spawn = output::SpawnRequest::new(None, "main", vec![], true);
        assert_eq!(
            command(output::Command::Spawn(spawn)),
            Ok(Command::Spawn(SpawnRequest {
                kind: None,
                method: "main".into(),
                input: vec![],
                monitor: true,
                link: false
            }))
        );
        let send = output::SendRequest::new(7, "t", output::Payload::new("bytes", vec![1]));
        assert_eq!(
            command(output::Command::Send(send)),
            Ok(Command::Send { to: Pid::from_u64(7), topic: "t".into(), body: Payload::bytes([1]) })
        );
        assert_eq!(command(output::Command::Link(3)), Ok(Command::Link(Pid::from_u64(3))));
        assert_eq!(command(output::Command::TrapExits(true)), Ok(Command::TrapExits(true)));
        let signal = output::ExitSignal { to: 4, reason: output::ExitReason::error("bye"), kill: false };
        assert_eq!(
            command(output::Command::Exit(signal)),
            Ok(Command::Exit(ExitSignal {
                to: Pid::from_u64(4),
                reason: ExitReason::Error("bye".into()),
                kill: false
            }))
        );
    }

    /// A list the lift left behind for its length fails with the scheduler's error for that
    /// limit, counting what the scheduler counts.
    #[test]
    fn what_was_over_a_cap_fails_with_the_schedulers_error() {
        let over = |len| output::Payload::over("bytes", len);
        let send = output::SendRequest::new(7, "topic", over(9));
        assert_eq!(command_from_output(output::Command::Send(send), CAPS), Err(payload_limit_exceeded(14, "send", 8)));
        let custom = output::CustomCommand::new("db.put", over(100));
        assert_eq!(
            command_from_output(output::Command::Custom(custom), CAPS),
            Err(payload_limit_exceeded(100, "db.put", 8))
        );
        let spawn =
            output::SpawnRequest::new(None, "main", vec![output::Payload::new("bytes", vec![0; 3]), over(9)], false);
        assert_eq!(
            command_from_output(output::Command::Spawn(spawn), CAPS),
            Err(payload_limit_exceeded(12, "spawn", 8))
        );
        let result = status_from_output(output::StatusKind::Complete(Ok(over(33))), CAPS);
        assert_eq!(result, Err(payload_limit_exceeded(33, "the result", 8)));
        let flood = yields_from_output(output::Capped::over_by(100_000), CAPS).err();
        assert_eq!(flood, Some(yield_limit_exceeded(100_000, 4)));
    }
}
