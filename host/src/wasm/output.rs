//! A step's output, lifted out of the guest with the per-step limits looked at first.
//!
//! Lifting copies a step's whole output into the host: every yield, payload and topic.
//! The scheduler's limits (`max_yields_per_step`, `max_payload_size`) only see the output
//! after that copy, so a step that yields 100,000 commands or returns a 32 MiB payload
//! would hold its worker for the whole copy, which cannot be preempted, only to be
//! refused. These types mirror the generated ones of `step-output`, with each list and
//! topic behind [`Capped`]: its lift reads the length the guest wrote and, when that alone
//! is over the step's [`Caps`], records the length instead of copying anything. The
//! conversion to the scheduler's types then fails the step with the scheduler's own error
//! for that limit (see `convert::output_from_wit`). So a flood or a giant payload costs
//! one bounded read, and an output within the limits is lifted exactly as before.
//!
//! The yields of a step that completes are discarded (DESIGN 2): the lift of [`Status`]
//! notes a `complete`, and the yields, lifted after it, are then not copied at all.
//!
//! Each byte string (payload, topic, name, error text) is bounded by `max_payload_size`,
//! and all of one step's output together by `max_output_per_step`: every one of a step's
//! 1,024 yields may point at the same 16 MiB of guest memory, which the guest holds once
//! and the host would copy 1,024 times. The lift of [`StepOutput`] counts the lengths as
//! it reads them, and once their sum is past the bound copies nothing more: the step then
//! fails with the scheduler's error for that limit, naming the sum the guest asked for.
//!
//! The caps are the thread's ([`with_caps`]): the lift runs inside the call to the guest,
//! on the thread (or the fiber on it) that makes the call, where the process's caps were
//! set just before.
//!
//! [`Capped`] implements wasmtime's hidden `ComponentType`/`Lift` methods by forwarding
//! to the type it wraps (`Vec<T>` or `String`), whose canonical-ABI form is a pointer and
//! a length. wasmtime is pinned (48.0.8); every step of every Wasm test lifts its output
//! through these types, and `tests/all/limits.rs` and `sandbox.rs` check the caps.

use std::cell::Cell;
use std::marker::PhantomData;

use wasmproc_types::Format;
use wasmtime::ValRaw;
use wasmtime::component::__internal::wasmtime_environ::component::StringEncoding;
use wasmtime::component::__internal::{CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext};
use wasmtime::component::{ComponentType, Lift};

pub(crate) use super::input::{FormatName, TrapKind};

/// The most a step's output may hold, from the scheduler's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    /// `max_yields_per_step`.
    pub(crate) yields: usize,
    /// `max_payload_size`: no one payload, topic or input list may be longer.
    pub(crate) bytes: usize,
    /// `max_output_per_step`: the byte strings of one step's output together.
    pub(crate) output: usize,
}

impl Caps {
    /// No limit: what a lift outside [`with_caps`] gets.
    const NONE: Caps = Caps { yields: usize::MAX, bytes: usize::MAX, output: usize::MAX };
}

/// The caps of the output being lifted on this thread.
#[derive(Clone, Copy)]
pub(crate) struct Lifting {
    caps: Caps,
    /// The step's status, lifted first, was `complete`: its yields are discarded.
    completed: bool,
    /// While a [`StepOutput`] is lifted: the bytes of the byte strings read so far,
    /// copied or not. `None` for the other lifts of a step (`send`, `respond`), each
    /// bounded on its own and handed on at once.
    output: Option<usize>,
}

impl Lifting {
    const NONE: Lifting = Lifting { caps: Caps::NONE, completed: false, output: None };
}

thread_local! {
    static LIFTING: Cell<Lifting> = const { Cell::new(Lifting::NONE) };
}

/// Runs `call` (a call into the guest, or a poll of one) with `caps` for the output it
/// lifts; the thread's earlier caps are back afterwards, however `call` ends.
pub(crate) fn with_caps<R>(caps: Caps, call: impl FnOnce() -> R) -> R {
    struct Restore(Lifting);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIFTING.set(self.0);
        }
    }
    let _restore = Restore(LIFTING.replace(Lifting { caps, ..Lifting::NONE }));
    call()
}

/// The caps of what this thread lifts now: the step's, inside [`with_caps`].
pub(crate) fn lifting_caps() -> Caps {
    LIFTING.get().caps
}

/// `ComponentType` for `$outer`, a type lifted as `$inner` is: the same canonical ABI,
/// flattening and type check, each forwarded to `$inner`'s.
macro_rules! component_type_as {
    ($outer:ty, $inner:ty) => {
        // SAFETY: every item forwards to `$inner`'s, so the ABI, flattening and type check
        // are its.
        unsafe impl ComponentType for $outer {
            type Lower = <$inner as ComponentType>::Lower;
            const ABI: CanonicalAbiInfo = <$inner as ComponentType>::ABI;
            const MAY_REQUIRE_REALLOC: bool = <$inner as ComponentType>::MAY_REQUIRE_REALLOC;

            fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
                <$inner as ComponentType>::typecheck(ty, types)
            }
        }
    };
}

/// Which cap bounds a [`Capped`] value's length.
pub(crate) trait Cap: Send + Sync + 'static {
    /// Whether a value of `count` elements is lifted; called once a value, as its lift
    /// begins.
    fn admits(count: usize) -> bool;
}

/// The step's yields: at most `max_yields_per_step`, none when the step completed.
pub(crate) struct YieldCount;

impl Cap for YieldCount {
    fn admits(count: usize) -> bool {
        let lifting = LIFTING.get();
        count <= if lifting.completed { 0 } else { lifting.caps.yields }
    }
}

/// A byte string: a payload's bytes, a topic, a name, an error's text. At most
/// `max_payload_size` each, and within a step's output, at most `max_output_per_step`
/// with all those before it.
pub(crate) struct Bytes;

impl Cap for Bytes {
    fn admits(count: usize) -> bool {
        let mut lifting = LIFTING.get();
        let Some(before) = lifting.output else {
            return count <= lifting.caps.bytes;
        };
        let total = before.saturating_add(count);
        lifting.output = Some(total);
        LIFTING.set(lifting);
        count <= lifting.caps.bytes && total <= lifting.caps.output
    }
}

/// A spawn's list of inputs: at most `max_payload_size` of them (each input's bytes are
/// [`Bytes`]).
pub(crate) struct InputCount;

impl Cap for InputCount {
    fn admits(count: usize) -> bool {
        count <= LIFTING.get().caps.bytes
    }
}

/// A list or string lifted only if its length is within cap `K`; otherwise its length.
pub(crate) struct Capped<T, K> {
    pub(crate) value: Result<T, usize>,
    kind: PhantomData<K>,
}

#[cfg(test)]
impl<T, K> Capped<T, K> {
    fn lifted(value: T) -> Self {
        Capped { value: Ok(value), kind: PhantomData }
    }

    pub(crate) fn over_by(len: usize) -> Self {
        Capped { value: Err(len), kind: PhantomData }
    }
}

impl<T: std::fmt::Debug, K> std::fmt::Debug for Capped<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Ok(value) => value.fmt(f),
            Err(len) => write!(f, "<{len} elements, over the cap>"),
        }
    }
}

/// A list or a string: lowered as a pointer and a length (`[ValRaw; 2]` flat).
pub(crate) trait PointerPair: Lift<Lower = [ValRaw; 2]> {
    /// The length field as it counts elements: a string's may carry the UTF-16 tag bit.
    fn count(len: u64) -> usize;
}

impl<T: Lift> PointerPair for Vec<T> {
    fn count(len: u64) -> usize {
        usize::try_from(len).unwrap_or(usize::MAX)
    }
}

impl PointerPair for String {
    fn count(len: u64) -> usize {
        // The canonical ABI's latin1+utf16 encoding tags UTF-16 strings with the high bit;
        // the rest counts code units.
        usize::try_from(len & !(1 << 31)).unwrap_or(usize::MAX)
    }
}

impl<T: PointerPair, K: Cap> Capped<T, K> {
    fn over(len: u64) -> Option<Self> {
        let count = T::count(len);
        (!K::admits(count)).then_some(Capped { value: Err(count), kind: PhantomData })
    }
}

// SAFETY: every item forwards to `T`'s, so the ABI, flattening and type check are `T`'s.
unsafe impl<T: PointerPair, K: Cap> ComponentType for Capped<T, K> {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = T::ABI;
    const MAY_REQUIRE_REALLOC: bool = T::MAY_REQUIRE_REALLOC;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        T::typecheck(ty, types)
    }
}

// SAFETY: a lift either reads only the length word of the pointer pair, which `T`'s lift
// would read first too, or is `T`'s lift.
unsafe impl<T: PointerPair, K: Cap> Lift for Capped<T, K> {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &Self::Lower) -> wasmtime::Result<Self> {
        if let Some(over) = Self::over(u64::from(src[1].get_u32())) {
            return Ok(over);
        }
        Ok(Capped { value: Ok(T::linear_lift_from_flat(cx, ty, src)?), kind: PhantomData })
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        if let Some(over) = Self::over(pointer_pair(bytes).1) {
            return Ok(over);
        }
        Ok(Capped { value: Ok(T::linear_lift_from_memory(cx, ty, bytes)?), kind: PhantomData })
    }
}

/// The pointer and the length of a pointer pair in memory (`bytes`, its canonical-ABI
/// form: 4 bytes each, 8 each for a 64-bit memory, little-endian).
fn pointer_pair(bytes: &[u8]) -> (u64, u64) {
    let half = bytes.len() / 2;
    let word = |at: &[u8]| {
        let mut word = [0u8; 8];
        word[..half.min(8)].copy_from_slice(&at[..half.min(8)]);
        u64::from_le_bytes(word)
    };
    (word(bytes), word(&bytes[half..]))
}

/// A payload's format ([`FormatName`], lowered in `input.rs`) is lifted as the host's
/// [`Format`]. The names the host knows (`json`, `bytes`, `text`: what nearly every
/// payload carries) are matched where the guest wrote them, so their lift allocates
/// nothing; any other name is lifted as the string it is.
impl FormatName {
    /// The known format at `ptr`, `len` in the guest's memory, if it is one; `None` for
    /// anything else (another name, another encoding, or out of bounds: the string's own
    /// lift then reports it).
    fn known(cx: &LiftContext<'_>, ptr: u64, len: u64) -> Option<FormatName> {
        if !matches!(cx.options().string_encoding, StringEncoding::Utf8) {
            return None;
        }
        let start = usize::try_from(ptr).ok()?;
        let bytes = cx.memory().get(start..start.checked_add(usize::try_from(len).ok()?)?)?;
        let format = match bytes {
            b"json" => Format::Json,
            b"bytes" => Format::Bytes,
            b"text" => Format::Text,
            _ => return None,
        };
        Some(FormatName(format))
    }

    /// Whether another name of `len` bytes is to be lifted: a name is a byte string like
    /// any other (see [`Bytes`]). Not when it is past the output's bound (which fails the
    /// step); an error when it is past `max_payload_size` itself.
    fn admits(count: usize) -> wasmtime::Result<bool> {
        let most = LIFTING.get().caps.bytes;
        if count > most {
            wasmtime::bail!(
                "payload limit exceeded: a {count}-byte format name is over `max_payload_size` ({most} bytes)"
            );
        }
        Ok(Bytes::admits(count))
    }
}

/// What an unknown name past the output's bound is lifted as: the step fails for the
/// bound, so the name is never read.
const UNREAD: FormatName = FormatName(Format::Bytes);

// One `ComponentType` for both directions: `input.rs` lowers the name, the `Lift` below
// lifts it.
component_type_as!(FormatName, String);

// SAFETY: a lift either reads the bytes the pointer pair names, within the memory's
// bounds, or is `String`'s.
unsafe impl Lift for FormatName {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &Self::Lower) -> wasmtime::Result<Self> {
        let (ptr, len) = (u64::from(src[0].get_u32()), u64::from(src[1].get_u32()));
        if let Some(known) = Self::known(cx, ptr, len) {
            return Ok(known);
        }
        if !Self::admits(String::count(len))? {
            return Ok(UNREAD);
        }
        Ok(FormatName(Format::from_name(&String::linear_lift_from_flat(cx, ty, src)?)))
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        let (ptr, len) = pointer_pair(bytes);
        if let Some(known) = Self::known(cx, ptr, len) {
            return Ok(known);
        }
        if !Self::admits(String::count(len))? {
            return Ok(UNREAD);
        }
        Ok(FormatName(Format::from_name(&String::linear_lift_from_memory(cx, ty, bytes)?)))
    }
}

/// `payload`, with its bytes capped and its format lifted by name.
#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct Payload {
    pub(crate) format: FormatName,
    pub(crate) data: Capped<Vec<u8>, Bytes>,
}

#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct SpawnRequest {
    pub(crate) kind: Option<Capped<String, Bytes>>,
    pub(crate) method: Capped<String, Bytes>,
    pub(crate) input: Capped<Vec<Payload>, InputCount>,
    pub(crate) monitor: bool,
    pub(crate) link: bool,
}

#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct SendRequest {
    pub(crate) to: u64,
    pub(crate) topic: Capped<String, Bytes>,
    pub(crate) body: Payload,
}

#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct CustomCommand {
    pub(crate) name: Capped<String, Bytes>,
    pub(crate) payload: Payload,
}

/// `trap`, with its message capped.
#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct Trap {
    pub(crate) kind: TrapKind,
    pub(crate) message: Capped<String, Bytes>,
}

/// `exit-reason`, with its payload and strings capped.
#[derive(ComponentType, Lift, Debug)]
#[component(variant)]
pub(crate) enum ExitReason {
    #[component(name = "normal")]
    Normal(Payload),
    #[component(name = "error")]
    Error(Capped<String, Bytes>),
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
    Noconnection(Capped<String, Bytes>),
}

#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct ExitSignal {
    pub(crate) to: u64,
    pub(crate) reason: ExitReason,
    pub(crate) kill: bool,
}

#[derive(ComponentType, Lift, Debug)]
#[component(variant)]
pub(crate) enum Command {
    #[component(name = "sleep")]
    Sleep(u64),
    #[component(name = "spawn")]
    Spawn(SpawnRequest),
    #[component(name = "send")]
    Send(SendRequest),
    #[component(name = "monitor")]
    Monitor(u64),
    #[component(name = "terminate")]
    Terminate(u64),
    #[component(name = "link")]
    Link(u64),
    #[component(name = "unlink")]
    Unlink(u64),
    #[component(name = "demonitor")]
    Demonitor(u64),
    #[component(name = "exit")]
    Exit(ExitSignal),
    #[component(name = "trap-exits")]
    TrapExits(bool),
    #[component(name = "custom")]
    Custom(CustomCommand),
}

#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct YieldCommand {
    pub(crate) tag: u64,
    pub(crate) command: Command,
}

#[derive(ComponentType, Lift, Debug)]
#[component(variant)]
pub(crate) enum StatusKind {
    #[component(name = "complete")]
    Complete(Result<Payload, Capped<String, Bytes>>),
    #[component(name = "idle")]
    Idle,
    #[component(name = "blocked")]
    Blocked,
    #[component(name = "continue")]
    Continue,
}

/// `status`: its lift notes a `complete` for the yields lifted after it.
#[derive(Debug)]
pub(crate) struct Status(pub(crate) StatusKind);

component_type_as!(Status, StatusKind);

// SAFETY: `StatusKind`'s lift; noting the case touches nothing of the guest's.
unsafe impl Lift for Status {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &Self::Lower) -> wasmtime::Result<Self> {
        StatusKind::linear_lift_from_flat(cx, ty, src).map(Status::noted)
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        StatusKind::linear_lift_from_memory(cx, ty, bytes).map(Status::noted)
    }
}

impl Status {
    fn noted(status: StatusKind) -> Status {
        if let StatusKind::Complete(_) = status {
            LIFTING.set(Lifting { completed: true, ..LIFTING.get() });
        }
        Status(status)
    }
}

/// `step-output` as the guest wrote it: the status first (the record's field order),
/// then the yields.
#[derive(ComponentType, Lift, Debug)]
#[component(record)]
pub(crate) struct StepRecord {
    pub(crate) status: Status,
    pub(crate) yields: Capped<Vec<YieldCommand>, YieldCount>,
}

/// `step-output`, with the bytes of its byte strings counted as they are lifted.
#[derive(Debug)]
pub(crate) struct StepOutput {
    pub(crate) status: Status,
    pub(crate) yields: Capped<Vec<YieldCommand>, YieldCount>,
    /// The bytes the output's byte strings hold together, when that is past
    /// `max_output_per_step`: the lift then copied none past the bound.
    pub(crate) over: Option<usize>,
}

component_type_as!(StepOutput, StepRecord);

impl StepOutput {
    /// Lifts the record with the count of its bytes on, and turns it off afterwards
    /// however the lift ends.
    fn counted(lift: impl FnOnce() -> wasmtime::Result<StepRecord>) -> wasmtime::Result<StepOutput> {
        struct Stop;
        impl Drop for Stop {
            fn drop(&mut self) {
                LIFTING.set(Lifting { output: None, ..LIFTING.get() });
            }
        }
        LIFTING.set(Lifting { output: Some(0), ..LIFTING.get() });
        let stop = Stop;
        let StepRecord { status, yields } = lift()?;
        let lifting = LIFTING.get();
        drop(stop);
        let total = lifting.output.unwrap_or(0);
        Ok(StepOutput { status, yields, over: (total > lifting.caps.output).then_some(total) })
    }
}

// SAFETY: `StepRecord`'s lift; counting touches nothing of the guest's.
unsafe impl Lift for StepOutput {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &Self::Lower) -> wasmtime::Result<Self> {
        StepOutput::counted(|| StepRecord::linear_lift_from_flat(cx, ty, src))
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        StepOutput::counted(|| StepRecord::linear_lift_from_memory(cx, ty, bytes))
    }
}

#[cfg(test)]
impl Payload {
    pub(crate) fn new(format: &str, data: Vec<u8>) -> Payload {
        Payload { format: FormatName(Format::from_name(format)), data: Capped::lifted(data) }
    }

    pub(crate) fn over(format: &str, len: usize) -> Payload {
        Payload { format: FormatName(Format::from_name(format)), data: Capped::over_by(len) }
    }
}

#[cfg(test)]
impl SendRequest {
    pub(crate) fn new(to: u64, topic: &str, body: Payload) -> SendRequest {
        SendRequest { to, topic: Capped::lifted(topic.to_owned()), body }
    }
}

#[cfg(test)]
impl SpawnRequest {
    pub(crate) fn new(kind: Option<String>, method: &str, input: Vec<Payload>, monitor: bool) -> SpawnRequest {
        SpawnRequest {
            kind: kind.map(Capped::lifted),
            method: Capped::lifted(method.to_owned()),
            input: Capped::lifted(input),
            monitor,
            link: false,
        }
    }
}

#[cfg(test)]
impl ExitReason {
    pub(crate) fn error(text: &str) -> ExitReason {
        ExitReason::Error(Capped::lifted(text.to_owned()))
    }
}

#[cfg(test)]
impl CustomCommand {
    pub(crate) fn new(name: &str, payload: Payload) -> CustomCommand {
        CustomCommand { name: Capped::lifted(name.to_owned()), payload }
    }
}
