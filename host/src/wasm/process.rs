//! [`WasmProcess`]: a [`Process`] whose steps run in a component instance.

use anyhow::{Context as _, anyhow, bail};
use wasmtime::{Store, Trap, WasmBacktrace};

use super::bindings::Process as Guest;
use super::bindings::wasmproc::process::types as wit;
use super::convert;
use super::log::Level;
use super::runtime::{Component, Limits, new_store, refuel};
use super::state::ProcessState;
use crate::process::{Events, Payload, Pid, Process, StepOutput};

/// A process running a [`Component`]: one store and one instance, created by `init` and
/// dropped by `close`, which gives the instance's memory slot back.
///
/// Every call into the guest runs under the component's time slice and memory cap. A
/// trap (including a limit hit) fails that call with an error that says which export
/// trapped and why; the scheduler then ends this process with it, and nothing else.
pub struct WasmProcess {
    component: Component,
    running: Option<Running>,
    /// The step's events as the guest sees them; kept so steps reuse its allocation.
    events: Vec<wit::Event>,
}

struct Running {
    store: Store<ProcessState>,
    guest: Guest,
}

impl WasmProcess {
    pub(crate) fn new(component: Component) -> Self {
        WasmProcess { component, running: None, events: Vec::new() }
    }
}

impl Process for WasmProcess {
    fn init(&mut self, pid: Pid, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        let loaded = self.component.loaded();
        if !loaded.entries.iter().any(|entry| entry == method) {
            bail!("unknown entry method `{method}`; this component has: {}", loaded.entries.join(", "));
        }
        let limits = self.component.limits;
        let mut store = new_store(loaded.pre.engine(), pid, loaded.log.clone(), &limits);
        let guest = loaded
            .pre
            .instantiate(&mut store)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("failed to instantiate process {pid}"))?;
        refuel(&mut store, limits.fuel);
        let input: Vec<wit::Payload> = input.into_iter().map(convert::payload_to_wit).collect();
        let accepted = guest
            .call_init(&mut store, pid.as_u64(), method, &input)
            .map_err(|e| guest_error(e, "init", &limits, store.data()))?;
        accepted.map_err(|message| anyhow!("the guest refused: {message}"))?;
        self.running = Some(Running { store, guest });
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let Some(Running { store, guest }) = &mut self.running else {
            bail!("`step` called on a Wasm process that is not initialised");
        };
        let limits = &self.component.limits;
        self.events.clear();
        self.events.extend(events.map(convert::event_to_wit));
        store.set_epoch_deadline(limits.time_slice_ticks);
        let result = guest.call_step(&mut *store, &self.events);
        // The payloads are the guest's now (copied into its memory); free them at once.
        self.events.clear();
        let output = result.map_err(|e| guest_error(e, "step", limits, store.data()))?;
        out.set_status(convert::status_from_wit(output.status));
        for y in output.yields {
            out.yield_command(y.tag, convert::command_from_wit(y.command));
        }
        Ok(())
    }

    fn close(&mut self) {
        self.running = None;
    }
}

impl std::fmt::Debug for WasmProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pid = self.running.as_ref().map(|r| r.store.data().pid());
        f.debug_struct("WasmProcess").field("component", &self.component).field("pid", &pid).finish()
    }
}

/// The error of a failed call to the guest's `export`, in one line: the time slice by
/// name if that stopped it, otherwise the root cause (the trap, or the limiter's message
/// for a memory-limit hit). The Wasm backtrace, when there is one, goes to the process's
/// log instead: it is many lines long and helps whoever debugs the guest, not whoever
/// reads the process's result.
pub(crate) fn guest_error(
    error: wasmtime::Error,
    export: &str,
    limits: &Limits,
    state: &ProcessState,
) -> anyhow::Error {
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => {
            return anyhow!(
                "time slice exceeded: `{export}` ran longer than the process's `time_slice` of {:?} and was stopped",
                limits.time_slice
            );
        }
        Some(Trap::OutOfFuel) => {
            return anyhow!(
                "fuel budget exhausted: the process used all of its {} units of `fuel` (in `{export}`)",
                limits.fuel.unwrap_or_default()
            );
        }
        _ => {}
    }
    let Some(backtrace) = error.downcast_ref::<WasmBacktrace>() else {
        return anyhow::Error::from(error).context(format!("guest `{export}` failed"));
    };
    state.log_host(Level::Error, &format!("guest `{export}` failed; wasm backtrace:\n{backtrace}"));
    anyhow!("guest `{export}` failed: {}", error.root_cause())
}
