//! What the SDK asks of the host: the WIT bindings of the `handler` world (the `process`
//! world and the `provider` import; a component that never answers a request leaves that
//! import out, so it stays a plain process component), the host functions (`log`,
//! `send`, `parent`, `max-yields`, `wait`, `respond`), and the mapping between the WIT types and the SDK's own.
//! The executor and `Ctx` reach the host only through here.

use crate::executor::{self, Outcome};
use crate::payload::{ExitReason, Format, Level, Message, Payload, Pid, Trap, TrapKind};

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "handler",
        pub_export_macro: true,
        export_macro_name: "__export_process",
        default_bindings_module: "wasmproc_guest::__private::bindings",
    });
}

use bindings::wasmproc::process::{host, types as wit};

/// Writes a line to the host's log.
pub(crate) fn log(level: Level, message: &str) {
    let level = match level {
        Level::Trace => host::Level::Trace,
        Level::Debug => host::Level::Debug,
        Level::Info => host::Level::Info,
        Level::Warn => host::Level::Warn,
        Level::Error => host::Level::Error,
    };
    #[cfg(target_arch = "wasm32")]
    host::log(level, message);
    // Native builds (the SDK's own tests) have no host to call.
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Puts a message in `to`'s mailbox through the host's `send` function, at once; the
/// host's reason if it refuses. Native builds (the SDK's own tests) have no host to
/// deliver to.
pub(crate) fn send(to: Pid, topic: &str, body: Payload) -> Result<(), String> {
    #[cfg(target_arch = "wasm32")]
    return host::send(to.as_u64(), topic, &body.into());
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = (to, topic, body);
        Err("no host to send through outside Wasm".to_owned())
    }
}

/// Ends the step with `output` in the host's `wait`: the next step's events, or, when
/// the host tells the guest to return from `step` instead, what to return (`output`'s
/// status, no yields: they were handed over). Native builds (the SDK's own tests) have no
/// host to wait in: `output`, to return.
pub(crate) fn wait(output: wit::StepOutput) -> Result<Vec<wit::Event>, wit::StepOutput> {
    #[cfg(target_arch = "wasm32")]
    return match host::wait(&output) {
        Some(events) => Ok(events),
        None => Err(wit::StepOutput { status: output.status, yields: Vec::new() }),
    };
    #[cfg(not(target_arch = "wasm32"))]
    Err(output)
}

/// The process `pid` as the executor needs to know it: with the host's per-step yield
/// limit. Native builds (the SDK's own tests) have no host: the host's default limit.
pub(crate) fn identity(pid: Pid) -> executor::Identity {
    #[cfg(target_arch = "wasm32")]
    return executor::Identity { pid, max_yields: usize::try_from(host::max_yields()).unwrap_or(usize::MAX) };
    #[cfg(not(target_arch = "wasm32"))]
    executor::Identity { pid, max_yields: 1024 }
}

/// The process that spawned this one, as the host says; none in native builds.
pub(crate) fn parent() -> Option<Pid> {
    #[cfg(target_arch = "wasm32")]
    return host::parent().map(Pid::from_u64);
    #[cfg(not(target_arch = "wasm32"))]
    None
}

/// Answers request `id` through the host's `provider.respond`.
pub(crate) fn respond(id: u64, result: Result<Payload, String>) -> Result<(), String> {
    #[cfg(target_arch = "wasm32")]
    return match result {
        Ok(payload) => bindings::wasmproc::process::provider::respond(id, Ok(&payload.into())),
        Err(error) => bindings::wasmproc::process::provider::respond(id, Err(&error)),
    };
    // Native builds have no host to answer.
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = (id, result);
        Err("no host to answer requests outside Wasm".to_owned())
    }
}

impl From<wit::Payload> for Payload {
    fn from(payload: wit::Payload) -> Self {
        Payload { format: Format::from_name(&payload.format), data: payload.data }
    }
}

impl From<Payload> for wit::Payload {
    fn from(payload: Payload) -> Self {
        wit::Payload { format: payload.format.as_str().to_owned(), data: payload.data }
    }
}

fn outcome_from(result: Result<wit::Payload, String>) -> Outcome {
    result.map(Payload::from)
}

impl From<wit::Event> for executor::Event {
    fn from(event: wit::Event) -> Self {
        match event {
            wit::Event::Completion(c) => executor::Event::Completion { tag: c.tag, result: outcome_from(c.result) },
            wit::Event::Message(m) => executor::Event::Message(Message {
                sender: Pid::from_u64(m.sender),
                topic: m.topic,
                body: m.body.into(),
            }),
            wit::Event::Exit(e) => {
                executor::Event::Exit { pid: Pid::from_u64(e.pid), reason: e.reason.into(), linked: e.linked }
            }
            wit::Event::Cancel(reason) => executor::Event::Cancel(reason),
        }
    }
}

impl From<wit::TrapKind> for TrapKind {
    fn from(kind: wit::TrapKind) -> Self {
        match kind {
            wit::TrapKind::Panic => TrapKind::Panic,
            wit::TrapKind::Unreachable => TrapKind::Unreachable,
            wit::TrapKind::OutOfFuel => TrapKind::OutOfFuel,
            wit::TrapKind::CpuBudget => TrapKind::CpuBudget,
            wit::TrapKind::MemoryLimit => TrapKind::MemoryLimit,
            wit::TrapKind::StackOverflow => TrapKind::StackOverflow,
            wit::TrapKind::Other => TrapKind::Other,
        }
    }
}

impl From<wit::ExitReason> for ExitReason {
    fn from(reason: wit::ExitReason) -> Self {
        match reason {
            wit::ExitReason::Normal(payload) => ExitReason::Normal(payload.into()),
            wit::ExitReason::Error(error) => ExitReason::Error(error),
            wit::ExitReason::Trap(trap) => ExitReason::Trap(Trap { kind: trap.kind.into(), message: trap.message }),
            wit::ExitReason::Killed => ExitReason::Killed,
            wit::ExitReason::Shutdown => ExitReason::Shutdown,
            wit::ExitReason::Terminated => ExitReason::Terminated,
            wit::ExitReason::Noproc => ExitReason::Noproc,
            wit::ExitReason::Noconnection(node) => ExitReason::Noconnection(node),
        }
    }
}

impl From<TrapKind> for wit::TrapKind {
    fn from(kind: TrapKind) -> Self {
        match kind {
            TrapKind::Panic => wit::TrapKind::Panic,
            TrapKind::Unreachable => wit::TrapKind::Unreachable,
            TrapKind::OutOfFuel => wit::TrapKind::OutOfFuel,
            TrapKind::CpuBudget => wit::TrapKind::CpuBudget,
            TrapKind::MemoryLimit => wit::TrapKind::MemoryLimit,
            TrapKind::StackOverflow => wit::TrapKind::StackOverflow,
            // `TrapKind` is non-exhaustive; a kind this SDK's contract lacks is `other`.
            _ => wit::TrapKind::Other,
        }
    }
}

impl From<ExitReason> for wit::ExitReason {
    fn from(reason: ExitReason) -> Self {
        match reason {
            ExitReason::Normal(payload) => wit::ExitReason::Normal(payload.into()),
            ExitReason::Error(error) => wit::ExitReason::Error(error),
            ExitReason::Trap(trap) => {
                wit::ExitReason::Trap(wit::Trap { kind: trap.kind.into(), message: trap.message })
            }
            ExitReason::Killed => wit::ExitReason::Killed,
            ExitReason::Shutdown => wit::ExitReason::Shutdown,
            ExitReason::Terminated => wit::ExitReason::Terminated,
            ExitReason::Noproc => wit::ExitReason::Noproc,
            ExitReason::Noconnection(node) => wit::ExitReason::Noconnection(node),
            // `ExitReason` is non-exhaustive; one this SDK's contract lacks is an error.
            other => wit::ExitReason::Error(other.to_string()),
        }
    }
}

impl From<executor::Command> for wit::Command {
    fn from(command: executor::Command) -> Self {
        use executor::Command;
        match command {
            Command::Sleep(nanos) => wit::Command::Sleep(nanos),
            Command::Spawn { kind, method, input, monitor, link } => wit::Command::Spawn(wit::SpawnRequest {
                kind,
                method,
                input: input.into_iter().map(Into::into).collect(),
                monitor,
                link,
            }),
            Command::Monitor(pid) => wit::Command::Monitor(pid.as_u64()),
            Command::Terminate(pid) => wit::Command::Terminate(pid.as_u64()),
            Command::Link(pid) => wit::Command::Link(pid.as_u64()),
            Command::Unlink(pid) => wit::Command::Unlink(pid.as_u64()),
            Command::Demonitor(pid) => wit::Command::Demonitor(pid.as_u64()),
            Command::Exit { to, reason, kill } => {
                wit::Command::Exit(wit::ExitSignal { to: to.as_u64(), reason: reason.into(), kill })
            }
            Command::TrapExits(trap) => wit::Command::TrapExits(trap),
            Command::Custom { name, payload } => {
                wit::Command::Custom(wit::CustomCommand { name, payload: payload.into() })
            }
        }
    }
}

impl From<executor::StepOutput> for wit::StepOutput {
    fn from(output: executor::StepOutput) -> Self {
        let status = match output.status {
            executor::Status::Complete(outcome) => wit::Status::Complete(outcome.map(Into::into)),
            executor::Status::Idle => wit::Status::Idle,
            executor::Status::Blocked => wit::Status::Blocked,
            executor::Status::Continue => wit::Status::Continue,
        };
        let yields =
            output.yields.into_iter().map(|y| wit::YieldCommand { tag: y.tag, command: y.command.into() }).collect();
        wit::StepOutput { status, yields }
    }
}
