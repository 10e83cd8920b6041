//! The `wait` host function (`wasmproc:process/host@0.2.1`): a step that ends inside the
//! guest's call of `step`, which stays suspended on its fiber until the next step.
//!
//! A guest calls `wait(output)` where it would have returned `output` from `step`. The
//! host ends the step there, exactly as at a return, and resumes the guest with the next
//! step's events as `wait`'s answer, so a process with more to do costs one call of
//! `step` for as long as it keeps waiting, not one a message. The protocol between the
//! host function and [`WasmProcess`](super::WasmProcess), which polls the step's future:
//!
//! 1. Before each poll of a step, `WasmProcess` says what the poll is for with
//!    [`Polling`]: a step (started or resumed after a preemption), a step that resumes a
//!    guest waiting in `wait` with its events, or the release of a waiting guest (`none`:
//!    return from `step`, see `WasmProcess::hibernate`).
//! 2. `wait`'s future, first polled inside a step, puts the output it lifted (within the
//!    step's caps, `output.rs`) in the thread's hand-off and answers `Pending`: wasmtime
//!    suspends the fiber (as an epoch yield does), and the step's future returns
//!    `Pending` to `WasmProcess`.
//! 3. `WasmProcess` finds the output in the hand-off ([`take_waited`]), which tells a
//!    `wait` from a preemption (which leaves none), keeps the future as waiting and
//!    answers the scheduler with the output as the step's.
//! 4. The next step puts its events in the hand-off and polls the future: `wait`'s
//!    future takes them and answers `some(events)`; the lowered events' buffer comes
//!    back to the thread ([`take_spare`]) for the step after.
//!
//! The hand-off is the thread's: the step's future is only ever polled on the thread
//! that set it up, and the guest's fiber runs on that thread while it is polled. Every
//! poll resets it ([`Polling::poll`]), so nothing of one process's poll reaches another's.

use std::cell::RefCell;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use wasmtime::StoreContextMut;
use wasmtime::component::__internal::{CanonicalAbiInfo, InstanceType, InterfaceType, LowerContext};
use wasmtime::component::{ComponentType, Lower};

use super::input::Event;
use super::output::StepOutput;
use super::store::ProcessState;

/// What the thread's poll of a step is for, and what passed between it and `wait`.
#[derive(Default)]
enum Handoff {
    /// No step is being polled (an `init`, an `entries`): `wait` is refused.
    #[default]
    Outside,
    /// A step runs (from its start, or resumed after a preemption): a `wait` ends it.
    Stepping,
    /// A step ended in `wait` with this output.
    Waited(StepOutput),
    /// The events for the guest suspended in `wait`: the next step's.
    Resume(Vec<Event>),
    /// The guest suspended in `wait` is told to return (`none`).
    Release,
    /// `wait` answered `none` in this poll: the guest must return, not wait again.
    Released,
}

thread_local! {
    static HANDOFF: RefCell<Handoff> = const { RefCell::new(Handoff::Outside) };
    /// The buffer of the events last handed to a waiting guest, emptied, for the next.
    static SPARE: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
}

/// What a poll of a step's future is for (step 1 of the protocol).
pub(crate) enum Polling {
    /// A step, from its start or resumed after a preemption.
    Step,
    /// A guest suspended in `wait`, resumed with these events.
    Resume(Vec<Event>),
    /// A guest suspended in `wait`, told to return from `step`.
    Release,
}

impl Polling {
    /// Runs `poll` (a poll of a step's future) with the hand-off set for `self`; the
    /// hand-off is back to `Outside` afterwards, however `poll` ends, with what a `wait`
    /// left in it returned: the output, if the step ended in `wait`.
    pub(crate) fn poll<R>(self, poll: impl FnOnce() -> R) -> (R, Option<StepOutput>) {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                HANDOFF.set(Handoff::Outside);
            }
        }
        let handoff = match self {
            Polling::Step => Handoff::Stepping,
            Polling::Resume(events) => Handoff::Resume(events),
            Polling::Release => Handoff::Release,
        };
        HANDOFF.set(handoff);
        let reset = Reset;
        let polled = poll();
        let waited = match HANDOFF.replace(Handoff::Outside) {
            Handoff::Waited(output) => Some(output),
            _ => None,
        };
        drop(reset);
        (polled, waited)
    }
}

/// The buffer of the events last handed to a waiting guest on this thread, emptied (an
/// empty vector if none was).
pub(crate) fn take_spare() -> Vec<Event> {
    SPARE.take()
}

/// `wait`'s future: `output` is handed over at its first poll; `store` is the waiting
/// guest's.
pub(crate) struct Wait<'a> {
    store: StoreContextMut<'a, ProcessState>,
    output: Option<StepOutput>,
}

impl<'a> Wait<'a> {
    pub(crate) fn new(store: StoreContextMut<'a, ProcessState>, output: StepOutput) -> Self {
        Wait { store, output: Some(output) }
    }

    /// The guest goes on in a new step: with a new time slice, counted from now, as a
    /// step's call starts with (`WasmProcess::run`).
    fn start_slice(&mut self) {
        self.store.data_mut().ticks.slice = 0;
        self.store.set_epoch_deadline(1);
    }
}

impl Future for Wait<'_> {
    type Output = wasmtime::Result<(Option<Batch>,)>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let polled = HANDOFF.with_borrow_mut(|handoff| {
            if let Some(output) = this.output.take() {
                return match std::mem::take(handoff) {
                    Handoff::Stepping => {
                        *handoff = Handoff::Waited(output);
                        Poll::Pending
                    }
                    Handoff::Released => {
                        *handoff = Handoff::Released;
                        Poll::Ready(Err(wasmtime::format_err!(
                            "the guest called `wait` again after `wait` returned `none`, instead of returning from \
                             `step`"
                        )))
                    }
                    _ => Poll::Ready(Err(wasmtime::format_err!(
                        "the guest called `wait` outside a step (in `init`); `wait` only ends a step"
                    ))),
                };
            }
            match std::mem::take(handoff) {
                Handoff::Resume(events) => {
                    *handoff = Handoff::Stepping;
                    Poll::Ready(Ok((Some(Batch(events)),)))
                }
                Handoff::Release => {
                    *handoff = Handoff::Released;
                    Poll::Ready(Ok((None,)))
                }
                // Polled again without a step's events: still waiting.
                other => {
                    *handoff = other;
                    Poll::Pending
                }
            }
        });
        if let Poll::Ready(Ok(_)) = &polled {
            this.start_slice();
        }
        polled
    }
}

/// The events `wait` answers with, lowered as a `list<event>`; their buffer goes back to
/// the thread's spare when wasmtime drops it, after lowering, so that a message through
/// `wait` allocates nothing on the host's side but its payload.
pub(crate) struct Batch(Vec<Event>);

impl Drop for Batch {
    fn drop(&mut self) {
        let mut events = std::mem::take(&mut self.0);
        events.clear();
        SPARE.with_borrow_mut(|spare| {
            if spare.capacity() < events.capacity() {
                *spare = events;
            }
        });
    }
}

// SAFETY: every item forwards to `Vec<Event>`'s, so the ABI, flattening and type check
// are a `list<event>`'s.
unsafe impl ComponentType for Batch {
    type Lower = <Vec<Event> as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <Vec<Event> as ComponentType>::ABI;
    const MAY_REQUIRE_REALLOC: bool = <Vec<Event> as ComponentType>::MAY_REQUIRE_REALLOC;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <Vec<Event> as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: `Vec<Event>`'s lowering of the events.
unsafe impl Lower for Batch {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        dst: &mut MaybeUninit<Self::Lower>,
    ) -> wasmtime::Result<()> {
        self.0.linear_lower_to_flat(cx, ty, dst)
    }

    fn linear_lower_to_memory<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        self.0.linear_lower_to_memory(cx, ty, offset)
    }
}

/// Whether `component` imports `wait`: its instances then call into wasmtime only
/// asynchronously (an import that suspends makes the whole instance so), on a fiber.
pub(crate) fn imports_wait(component: &wasmtime::component::Component) -> bool {
    use wasmtime::component::types::ComponentItem;
    let engine = component.engine();
    component.component_type().imports(engine).any(|(name, item)| {
        name.starts_with("wasmproc:process/host@")
            && matches!(&item.ty, ComponentItem::ComponentInstance(instance)
                if instance.exports(engine).any(|(name, _)| name == "wait"))
    })
}

/// Polls `future` once, for a call that cannot suspend (`init`, `entries` of a component
/// that imports `wait`: nothing in them yields, and `wait` refuses outside a step);
/// `None` if it did.
pub(crate) fn now<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(std::task::Waker::noop())) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}
