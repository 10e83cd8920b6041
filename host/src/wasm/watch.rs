//! [`watch`]: what stops or preempts a call into a guest at an epoch tick, for processes
//! and WASI programs alike: the time slice, the CPU budget, and whatever else the caller
//! asks to stop for (a terminate request, a WASI program's interrupt or time limit).

use std::time::Duration;

use crate::process::Port;

use wasmtime::{Store, UpdateDeadline};

/// Epoch ticks that a store's calls have seen (see [`watch`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Ticks {
    /// Of the current time slice: reset at each yield, and by whoever starts a call.
    pub(crate) slice: u64,
    /// Over the store's whole life: the CPU time its calls ran, for the CPU budget.
    pub(crate) cpu: u64,
}

/// What [`watch`] holds a store's calls to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch {
    /// Ticks of a time slice, and the slice as configured (for the error).
    pub(crate) slice: u64,
    pub(crate) slice_limit: Duration,
    /// Whether the calls run on a fiber that may yield (a preemptible step): at the end of
    /// a slice they yield, otherwise they fail with [`Stopped::TimeSlice`].
    pub(crate) preemptible: bool,
    /// The CPU budget in ticks and as configured, if there is one.
    pub(crate) cpu_budget: Option<(u64, Duration)>,
}

/// Why a call into a guest was stopped at an epoch tick. The error [`watch`]'s callback
/// fails a call with; found again with `downcast_ref` to give the plain message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The process's or program's CPU time reached its `cpu_budget`.
    CpuBudget(Duration),
    /// A step without preemption outlasted its time slice.
    TimeSlice(Duration),
    /// The scheduler was asked to terminate the process.
    Terminated,
    /// A WASI program's interrupt flag was raised (`WasiOptions::interrupt`).
    Interrupted,
    /// A WASI program outlasted its `WasiOptions::time_limit`.
    TimeLimit(Duration),
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopped::CpuBudget(budget) => write!(
                f,
                "CPU budget exceeded: the process ran for longer than its `cpu_budget` of {budget:?} and was stopped"
            ),
            Stopped::TimeSlice(slice) => write!(
                f,
                "time slice exceeded: `step` ran longer than the process's `time_slice` of {slice:?} and was stopped \
                 (preemption is off)"
            ),
            Stopped::Terminated => f.write_str("terminated"),
            Stopped::Interrupted => f.write_str("interrupted: the host stopped the program"),
            Stopped::TimeLimit(limit) => write!(f, "time limit exceeded: the program ran longer than {limit:?}"),
        }
    }
}

impl std::error::Error for Stopped {}

/// Looks at every call of `store` once an epoch tick, whatever the time slice, so that a
/// guest that never returns is still stopped within a tick of being asked to:
///
/// 1. past its CPU budget (`ticks.cpu`, counted here), the call fails with
///    [`Stopped::CpuBudget`];
/// 2. when its process is asked to terminate ([`Port::is_terminating`]), it fails with
///    [`Stopped::Terminated`]; when `stop` says so (a WASI program's interrupt or time
///    limit), with what `stop` returned;
/// 3. at the end of its time slice, or at any tick at which other processes wait on its
///    scheduler ([`Port::should_yield`]), a preemptible call yields its fiber (the
///    latency a computing process adds to the others is then one tick, not one slice); a
///    plain call past its slice fails with [`Stopped::TimeSlice`].
///
/// The callback costs a few atomic operations a tick while the store runs Wasm, and
/// nothing while it does not. `ticks` finds the store's counters.
pub(crate) fn watch<T: 'static>(
    store: &mut Store<T>,
    watch: Watch,
    ticks: fn(&mut T) -> &mut Ticks,
    port: Port,
    stop: impl Fn() -> Option<Stopped> + Send + Sync + 'static,
) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut cx| {
        let ticks = ticks(cx.data_mut());
        ticks.slice += 1;
        ticks.cpu += 1;
        if let Some((budget, configured)) = watch.cpu_budget
            && ticks.cpu >= budget
        {
            return Err(wasmtime::Error::new(Stopped::CpuBudget(configured)));
        }
        if port.is_terminating() {
            return Err(wasmtime::Error::new(Stopped::Terminated));
        }
        if let Some(stopped) = stop() {
            return Err(wasmtime::Error::new(stopped));
        }
        if ticks.slice >= watch.slice || (watch.preemptible && port.should_yield()) {
            if !watch.preemptible {
                return Err(wasmtime::Error::new(Stopped::TimeSlice(watch.slice_limit)));
            }
            ticks.slice = 0;
            return Ok(UpdateDeadline::Yield(1));
        }
        Ok(UpdateDeadline::Continue(1))
    });
}
