//! Conversions between the scheduler's values and the WIT types of the `process` world.
//!
//! Payload bytes move, never copy: an event's body becomes the guest-bound value and a
//! yield's payload becomes the host's, so a step copies each payload only where the
//! canonical ABI must (into and out of guest memory).

use std::time::Duration;

use wasmproc_types::{Format, Level, Payload, Pid};

use super::bindings::wasmproc::process::host;
use super::bindings::wasmproc::process::types as wit;
use crate::scheduler::process::{Command, Event, Outcome, SpawnRequest, Status};

pub(crate) fn payload_to_wit(payload: Payload) -> wit::Payload {
    wit::Payload { format: payload.format.as_str().to_owned(), data: payload.data }
}

pub(crate) fn payload_from_wit(payload: wit::Payload) -> Payload {
    Payload { format: Format::from_name(&payload.format), data: payload.data }
}

fn outcome_to_wit(outcome: Outcome) -> Result<wit::Payload, String> {
    outcome.map(payload_to_wit)
}

pub(crate) fn event_to_wit(event: Event) -> wit::Event {
    match event {
        Event::Completion { tag, result } => {
            wit::Event::Completion(wit::Completion { tag, result: outcome_to_wit(result) })
        }
        Event::Message { sender, topic, body } => {
            wit::Event::Message(wit::Message { sender: sender.as_u64(), topic, body: payload_to_wit(body) })
        }
        Event::Exit { pid, result } => {
            wit::Event::Exit(wit::Exit { pid: pid.as_u64(), result: outcome_to_wit(result) })
        }
        Event::Cancel { reason } => wit::Event::Cancel(reason),
    }
}

pub(crate) fn status_from_wit(status: wit::Status) -> Status {
    match status {
        wit::Status::Complete(result) => Status::Complete(result.map(payload_from_wit)),
        wit::Status::Idle => Status::Idle,
        wit::Status::Blocked => Status::Blocked,
        wit::Status::Continue => Status::Continue,
    }
}

pub(crate) fn command_from_wit(command: wit::Command) -> Command {
    match command {
        wit::Command::Sleep(nanos) => Command::Sleep(Duration::from_nanos(nanos)),
        wit::Command::Spawn(request) => Command::Spawn(SpawnRequest {
            kind: request.kind,
            method: request.method,
            input: request.input.into_iter().map(payload_from_wit).collect(),
            monitor: request.monitor,
        }),
        wit::Command::Send(request) => {
            Command::Send { to: Pid::from_u64(request.to), topic: request.topic, body: payload_from_wit(request.body) }
        }
        wit::Command::Monitor(pid) => Command::Monitor(Pid::from_u64(pid)),
        wit::Command::Terminate(pid) => Command::Terminate(Pid::from_u64(pid)),
        wit::Command::Custom(custom) => {
            Command::Custom { name: custom.name.into(), payload: payload_from_wit(custom.payload) }
        }
    }
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

    #[test]
    fn commands_keep_their_fields() {
        assert_eq!(command_from_wit(wit::Command::Sleep(1_500)), Command::Sleep(Duration::from_nanos(1_500)));
        let custom = wit::CustomCommand {
            name: "db.get".to_owned(),
            payload: wit::Payload { format: "text".to_owned(), data: b"k".to_vec() },
        };
        assert_eq!(
            command_from_wit(wit::Command::Custom(custom)),
            Command::Custom { name: "db.get".into(), payload: Payload::text("k") }
        );
        let spawn = wit::SpawnRequest { kind: None, method: "main".to_owned(), input: vec![], monitor: true };
        assert_eq!(
            command_from_wit(wit::Command::Spawn(spawn)),
            Command::Spawn(SpawnRequest { kind: None, method: "main".into(), input: vec![], monitor: true })
        );
    }

    #[test]
    fn events_keep_their_fields() {
        let event = event_to_wit(Event::Exit { pid: Pid::from_u64(9), result: Err("noproc".into()) });
        assert!(matches!(event, wit::Event::Exit(wit::Exit { pid: 9, result: Err(ref e) }) if e == "noproc"));
        let event = event_to_wit(Event::Message { sender: Pid::HOST, topic: "t".into(), body: Payload::u64(3) });
        assert!(matches!(event, wit::Event::Message(ref m) if m.sender == 0 && m.body.format == "bytes"));
    }
}
