//! A step's events as they are lowered into the guest, made from the scheduler's events
//! without a copy or an allocation.
//!
//! The generated `event` type holds a payload's format as a `String`, so handing it the
//! scheduler's events allocated the format's name for every event with a payload (most
//! of them: a completion, a message, an exit). These types mirror the generated ones of
//! `event`, with the format kept as the scheduler's [`Format`] and lowered as its name;
//! the bytes, the topic and the errors move in as they are. The typed `step` is checked
//! against the component's own types when it is loaded (`Process::check_step`), so a
//! field or case these types got wrong fails the load, not a step.
//!
//! [`FormatName`] implements wasmtime's hidden `Lower` methods by forwarding to `str`'s
//! (its `ComponentType`, a string's, and its `Lift` are in `output.rs`); wasmtime is
//! pinned (48.0.8), and every step of every Wasm test lowers its events through these
//! types.

use std::mem::MaybeUninit;

use wasmproc_types::Format;
use wasmtime::component::__internal::{InterfaceType, LowerContext};
use wasmtime::component::{ComponentType, Lift, Lower};

use crate::step::{self as host, Outcome};

/// A payload's format, as the canonical ABI carries it: a `string`, its name. Lowered
/// here from the name; lifted in `output.rs`, where its `ComponentType` (a string's) is
/// written too.
#[derive(Debug)]
pub(crate) struct FormatName(pub(crate) Format);

// SAFETY: `str`'s lowering of the name.
unsafe impl Lower for FormatName {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        dst: &mut MaybeUninit<Self::Lower>,
    ) -> wasmtime::Result<()> {
        self.0.as_str().linear_lower_to_flat(cx, ty, dst)
    }

    fn linear_lower_to_memory<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        self.0.as_str().linear_lower_to_memory(cx, ty, offset)
    }
}

/// `payload`.
#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(crate) struct Payload {
    pub(crate) format: FormatName,
    pub(crate) data: Vec<u8>,
}

#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(crate) struct Completion {
    pub(crate) tag: u64,
    pub(crate) result: Result<Payload, String>,
}

#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(crate) struct Message {
    pub(crate) sender: u64,
    pub(crate) topic: String,
    pub(crate) body: Payload,
}

/// `trap-kind`, both ways: lowered into an exit event, lifted out of an exit signal.
#[derive(ComponentType, Lower, Lift, Debug, Clone, Copy, PartialEq, Eq)]
#[component(enum)]
#[repr(u8)]
pub(crate) enum TrapKind {
    #[component(name = "panic")]
    Panic,
    #[component(name = "unreachable")]
    Unreachable,
    #[component(name = "out-of-fuel")]
    OutOfFuel,
    #[component(name = "cpu-budget")]
    CpuBudget,
    #[component(name = "memory-limit")]
    MemoryLimit,
    #[component(name = "stack-overflow")]
    StackOverflow,
    #[component(name = "other")]
    Other,
}

/// `trap`.
#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(crate) struct Trap {
    pub(crate) kind: TrapKind,
    pub(crate) message: String,
}

/// `exit-reason`.
#[derive(ComponentType, Lower, Debug)]
#[component(variant)]
pub(crate) enum ExitReason {
    #[component(name = "normal")]
    Normal(Payload),
    #[component(name = "error")]
    Error(String),
    #[component(name = "trap")]
    Trap(Trap),
    #[component(name = "killed")]
    Killed,
    #[component(name = "shutdown")]
    Shutdown,
    #[component(name = "terminated")]
    Terminated,
    #[component(name = "noproc")]
    Noproc,
    #[component(name = "noconnection")]
    Noconnection(String),
}

#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(crate) struct Exit {
    pub(crate) pid: u64,
    pub(crate) reason: ExitReason,
    pub(crate) linked: bool,
}

/// `event`.
#[derive(ComponentType, Lower, Debug)]
#[component(variant)]
pub(crate) enum Event {
    #[component(name = "completion")]
    Completion(Completion),
    #[component(name = "message")]
    Message(Message),
    #[component(name = "exit")]
    Exit(Exit),
    #[component(name = "cancel")]
    Cancel(String),
}

impl From<wasmproc_types::Payload> for Payload {
    fn from(payload: wasmproc_types::Payload) -> Payload {
        Payload { format: FormatName(payload.format), data: payload.data }
    }
}

fn outcome(outcome: Outcome) -> Result<Payload, String> {
    outcome.map(Payload::from)
}

impl From<wasmproc_types::TrapKind> for TrapKind {
    fn from(kind: wasmproc_types::TrapKind) -> TrapKind {
        use wasmproc_types::TrapKind as Kind;
        match kind {
            Kind::Panic => TrapKind::Panic,
            Kind::Unreachable => TrapKind::Unreachable,
            Kind::OutOfFuel => TrapKind::OutOfFuel,
            Kind::CpuBudget => TrapKind::CpuBudget,
            Kind::MemoryLimit => TrapKind::MemoryLimit,
            Kind::StackOverflow => TrapKind::StackOverflow,
            // Kinds a later `wasmproc-types` may add reach a guest of this contract as
            // the one that covers them.
            _ => TrapKind::Other,
        }
    }
}

impl From<TrapKind> for wasmproc_types::TrapKind {
    fn from(kind: TrapKind) -> wasmproc_types::TrapKind {
        use wasmproc_types::TrapKind as Kind;
        match kind {
            TrapKind::Panic => Kind::Panic,
            TrapKind::Unreachable => Kind::Unreachable,
            TrapKind::OutOfFuel => Kind::OutOfFuel,
            TrapKind::CpuBudget => Kind::CpuBudget,
            TrapKind::MemoryLimit => Kind::MemoryLimit,
            TrapKind::StackOverflow => Kind::StackOverflow,
            TrapKind::Other => Kind::Other,
        }
    }
}

impl From<wasmproc_types::ExitReason> for ExitReason {
    fn from(reason: wasmproc_types::ExitReason) -> ExitReason {
        use wasmproc_types::ExitReason as Reason;
        match reason {
            Reason::Normal(payload) => ExitReason::Normal(payload.into()),
            Reason::Error(error) => ExitReason::Error(error),
            Reason::Trap(trap) => ExitReason::Trap(Trap { kind: trap.kind.into(), message: trap.message }),
            Reason::Killed => ExitReason::Killed,
            Reason::Shutdown => ExitReason::Shutdown,
            Reason::Terminated => ExitReason::Terminated,
            Reason::Noproc => ExitReason::Noproc,
            Reason::Noconnection(node) => ExitReason::Noconnection(node),
            // A reason a later `wasmproc-types` may add reaches a guest of this contract
            // as an error that names it.
            other => ExitReason::Error(other.to_string()),
        }
    }
}

impl From<host::Event> for Event {
    fn from(event: host::Event) -> Event {
        match event {
            host::Event::Completion { tag, result } => Event::Completion(Completion { tag, result: outcome(result) }),
            host::Event::Message { sender, topic, body } => {
                Event::Message(Message { sender: sender.as_u64(), topic, body: body.into() })
            }
            host::Event::Exit { pid, reason, linked } => {
                Event::Exit(Exit { pid: pid.as_u64(), reason: reason.into(), linked })
            }
            host::Event::Cancel { reason } => Event::Cancel(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use wasmproc_types::Pid;

    use super::*;

    #[test]
    fn events_keep_their_fields_and_their_bytes() {
        let event = Event::from(host::Event::Exit {
            pid: Pid::from_u64(9),
            reason: wasmproc_types::ExitReason::Noproc,
            linked: true,
        });
        assert!(matches!(event, Event::Exit(Exit { pid: 9, reason: ExitReason::Noproc, linked: true })));
        let trap = wasmproc_types::ExitReason::trap(wasmproc_types::TrapKind::OutOfFuel, "fuel");
        let event = Event::from(host::Event::Exit { pid: Pid::from_u64(9), reason: trap, linked: false });
        assert!(matches!(
            event,
            Event::Exit(Exit { reason: ExitReason::Trap(Trap { kind: TrapKind::OutOfFuel, ref message }), .. })
                if message == "fuel"
        ));
        let body = wasmproc_types::Payload::u64(3);
        let bytes = body.data.as_ptr();
        let event = Event::from(host::Event::Message { sender: Pid::HOST, topic: "t".into(), body });
        let Event::Message(message) = event else { panic!("a message stays a message") };
        assert_eq!((message.sender, message.topic.as_str(), message.body.format.0.as_str()), (0, "t", "bytes"));
        assert_eq!(message.body.data.as_ptr(), bytes, "the body moved, not copied");
        let event = Event::from(host::Event::Completion { tag: 4, result: Ok(wasmproc_types::Payload::text("x")) });
        assert!(
            matches!(event, Event::Completion(Completion { tag: 4, result: Ok(ref p) }) if p.format.0.as_str() == "text")
        );
        assert!(
            matches!(Event::from(host::Event::Cancel { reason: "stop".into() }), Event::Cancel(ref r) if r == "stop")
        );
    }
}
