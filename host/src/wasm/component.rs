//! [`Component`]: a loaded guest of the `process` world, checked against the world and
//! ready to instantiate; and the linker that gives such guests their imports.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use wasmtime::Engine;
use wasmtime::component::{HasSelf, Linker};

use wasmproc_types::Pid;

use super::bindings::handler::wasmproc::process::provider;
use super::bindings::{HOST_INTERFACE, PROVIDER_INTERFACE, Process as Guest, ProcessIndices, ProcessPre, WORLD};
use super::config::Config;
use super::engine::EpochClock;
use super::hibernate::Reference;
use super::image::{self, GuestImage};
use super::output::{self, Bytes, Capped};
use super::process::{Hooks, Loaded, WasmProcess, guest_error, kind_limits};
use super::store::{ProcessLimits, ProcessState, new_store};
use super::waiting;
use crate::handler::{Factory, KindLimits};
use crate::process::Process;

/// A loaded component: compiled, checked against the `process` world, ready to
/// instantiate. Cheap to clone (clones share the compiled code).
///
/// It is a [`Factory`]: register it as a process kind
/// (`Scheduler::builder().kind("hello", component.clone())`) and spawn processes of it by
/// kind, from the embedder ([`Spawnable::kind`](crate::scheduler::Spawnable::kind)) or from
/// other processes (the `spawn` command). Or spawn one directly with
/// [`Component::process`].
#[derive(Clone)]
pub struct Component {
    loaded: Arc<Loaded>,
    limits: ProcessLimits,
}

/// The linker of processes: WASI p2 (what each process is granted is its store's, see
/// `store.rs`) and the world's host imports.
pub(crate) fn linker(engine: &Engine) -> anyhow::Result<Linker<ProcessState>> {
    let mut linker = Linker::<ProcessState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(anyhow::Error::from).context("failed to link WASI")?;
    Guest::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
        .map_err(anyhow::Error::from)
        .context("failed to link the host imports")?;
    provider::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
        .map_err(anyhow::Error::from)
        .context("failed to link the provider imports")?;
    // `send` and `respond` again, over the generated ones: lifted within the step's
    // limits, they refuse a message or an answer over them before copying it (see
    // `output.rs`).
    linker.allow_shadowing(true);
    linker
        .instance(HOST_INTERFACE)
        .and_then(|mut host| {
            host.func_wrap("send", |mut store, (to, topic, body): (u64, Capped<String, Bytes>, output::Payload)| {
                store.data_mut().send_capped(to, topic, body).map(|sent| (sent,))
            })
        })
        .map_err(anyhow::Error::from)
        .context("failed to link the capped `send`")?;
    // `wait` suspends the guest's fiber until the next step (`waiting.rs`); its output is
    // lifted within the step's caps, as a returned one is.
    linker
        .instance(HOST_INTERFACE)
        .and_then(|mut host| {
            host.func_wrap_async("wait", |store, (output,): (output::StepOutput,)| {
                Box::new(waiting::Wait::new(store, output))
            })
        })
        .map_err(anyhow::Error::from)
        .context("failed to link `wait`")?;
    linker
        .instance(PROVIDER_INTERFACE)
        .and_then(|mut provider| {
            type Answer = Result<output::Payload, Capped<String, Bytes>>;
            provider.func_wrap("respond", |mut store, (id, result): (u64, Answer)| {
                Ok((store.data_mut().respond_capped(id, result),))
            })
        })
        .map_err(anyhow::Error::from)
        .context("failed to link the capped `respond`")?;
    linker.allow_shadowing(false);
    Ok(linker)
}

/// Instantiates `pre` in `store`: asynchronously if the component imports `wait`
/// (`waits`), which makes all its calls so; with its memory `image` if it was split.
pub(crate) fn instantiate(
    pre: &ProcessPre<ProcessState>,
    store: &mut wasmtime::Store<ProcessState>,
    waits: bool,
    image: Option<&Arc<GuestImage>>,
) -> wasmtime::Result<Guest> {
    image::instantiating(image, || {
        if waits {
            waiting::now(pre.instantiate_async(&mut *store)).unwrap_or_else(|| Err(suspended("instantiation")))
        } else {
            pre.instantiate(&mut *store)
        }
    })
}

/// The error of a call outside a step that was suspended: nothing in it yields (no
/// epoch yield is set up before the first step, and `wait` refuses outside one).
pub(crate) fn suspended(call: &str) -> wasmtime::Error {
    wasmtime::format_err!("`{call}` was suspended, which only a step may be")
}

/// What the load of a component found besides its code: the digest of its bytes, its
/// memory image if it was split (`image.rs`), and its initial memory for whole-instance
/// hibernation (`hibernate.rs`).
pub(crate) struct Prepared {
    pub(crate) digest: super::cache::Digest,
    pub(crate) image: Option<Arc<GuestImage>>,
    pub(crate) reference: Option<Arc<Reference>>,
    pub(crate) counts: Arc<super::hibernate::Counts>,
}

impl Component {
    /// Checks `compiled` against the world (linked by `linker`) and reads its entries,
    /// with the runtime's settings `config`.
    pub(crate) fn prepare(
        linker: &Linker<ProcessState>,
        engine: &Engine,
        config: &Config,
        clock: &EpochClock,
        compiled: wasmtime::component::Component,
        prepared: Prepared,
    ) -> anyhow::Result<Component> {
        let Prepared { digest, image, reference, counts } = prepared;
        if let Some(version) = super::bindings::other_version(&compiled) {
            anyhow::bail!(
                "the component was built for `wasmproc:process@{version}`, but this host runs \
                 `wasmproc:process@{}` (world `{WORLD}`): rebuild it with the current SDK (`wasmproc-guest`) or \
                 against this host's `wit/`",
                super::bindings::VERSION
            );
        }
        let not_a_process = || format!("the component does not fit the `{WORLD}` world");
        let pre = linker.instantiate_pre(&compiled).map_err(anyhow::Error::from).with_context(not_a_process)?;
        let pre = ProcessPre::new(pre).map_err(anyhow::Error::from).with_context(not_a_process)?;
        let limits = ProcessLimits::new(config, config.max_memory, config.time_slice);

        let waits = waiting::imports_wait(&compiled);
        let mut store = new_store(engine, Pid::HOST, config.log.clone(), &limits);
        let guest = instantiate(&pre, &mut store, waits, image.as_ref())
            .map_err(|e| match limits.instance.name_exceeded(&e) {
                Some(exceeded) => exceeded,
                // Instantiation runs the core modules' start functions under `init`'s limit.
                None if matches!(e.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt)) => {
                    guest_error(e, "instantiation", &limits, store.data())
                }
                None => anyhow::Error::from(e),
            })
            .context("failed to instantiate")?;
        // `entries` is the host asking, not the process running, so it is not charged to
        // a process's fuel budget: the instantiation's unbounded fuel stays (a small
        // budget would otherwise make every component fail to load, as a bad module).
        // The init time limit, the store's deadline, bounds it instead.
        let entries = if waits {
            waiting::now(guest.call_entries_async(&mut store)).unwrap_or_else(|| Err(suspended("entries")))
        } else {
            guest.call_entries(&mut store)
        };
        let entries = entries.map_err(|e| guest_error(e, "entries", &limits, store.data()))?;
        ensure!(!entries.is_empty(), "the component exports no entry methods (`entries` returned none)");
        guest.check_step(&store).map_err(anyhow::Error::from).with_context(not_a_process)?;

        let indices =
            ProcessIndices::new(pre.instance_pre()).map_err(anyhow::Error::from).with_context(not_a_process)?;
        let loaded = Loaded {
            pre,
            indices,
            entries,
            log: config.log.clone(),
            clock: clock.clone(),
            config: config.clone(),
            digest,
            waits,
            image,
            hooks: reference.filter(|_| config.hibernate_instances).and_then(|reference| {
                let hooks = Hooks::of(&compiled, reference, counts);
                if hooks.is_none() {
                    tracing::debug!("the component's processes are never hibernated whole: it has no hooks");
                }
                hooks
            }),
        };
        Ok(Component { loaded: Arc::new(loaded), limits })
    }

    /// The SHA-256 of the bytes it was loaded from, as `sha256:<hex>` (of the precompiled
    /// file, for one made by `Runtime::precompile`).
    pub fn hash(&self) -> String {
        format!("sha256:{}", crate::codec::hex(&self.loaded.digest))
    }

    /// The entry methods the component offers, as its `entries` export listed them
    /// when it was loaded.
    pub fn entries(&self) -> &[String] {
        &self.loaded.entries
    }

    /// A new process of this component, not yet initialised: hand it to
    /// [`Handle::spawn`](crate::Handle::spawn).
    pub fn process(&self) -> WasmProcess {
        WasmProcess::new(self.loaded.clone(), self.limits)
    }

    /// This component with a lower memory cap for its processes (each process of the
    /// returned component; the original keeps its own). By default the runtime's
    /// [`Config::max_memory`].
    ///
    /// # Errors
    ///
    /// `bytes` is above the runtime's `max_memory`: the memory arena's slots hold no more.
    pub fn with_max_memory(&self, bytes: usize) -> anyhow::Result<Component> {
        let arena_max = self.loaded.config.max_memory;
        ensure!(bytes <= arena_max, "`max_memory` of {bytes} bytes is above the runtime's `max_memory` of {arena_max}");
        Ok(Component {
            loaded: self.loaded.clone(),
            limits: ProcessLimits::new(&self.loaded.config, bytes, self.limits.time_slice),
        })
    }

    /// This component with another time slice for its processes. By default the
    /// runtime's [`Config::time_slice`].
    pub fn with_time_slice(&self, slice: Duration) -> Component {
        Component {
            loaded: self.loaded.clone(),
            limits: ProcessLimits::new(&self.loaded.config, self.limits.max_memory, slice),
        }
    }

    /// The memory cap of this component's processes, in bytes.
    pub fn max_memory(&self) -> usize {
        self.limits.max_memory
    }

    /// The time slice of this component's processes.
    pub fn time_slice(&self) -> Duration {
        self.limits.time_slice
    }

    fn kind_limits(&self) -> KindLimits {
        kind_limits(&self.limits)
    }
}

impl std::fmt::Debug for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Component").field("entries", &self.loaded.entries).field("limits", &self.limits).finish()
    }
}

impl Factory for Component {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        Ok(Box::new(self.process()))
    }

    fn identity(&self) -> Option<String> {
        Some(self.hash())
    }

    fn limits(&self) -> Option<KindLimits> {
        Some(self.kind_limits())
    }

    /// A process under the tighter of this component's limits and `bound`: the same
    /// compiled code (nothing is recompiled), other limits.
    ///
    /// # Errors
    ///
    /// `bound` has a fuel budget and this runtime meters no fuel: metering is compiled
    /// into the code, so the budget could not hold.
    fn make_within(&self, bound: KindLimits) -> anyhow::Result<Box<dyn Process>> {
        let own = self.kind_limits();
        let tight = own.min(bound);
        if tight == own {
            return Ok(Box::new(self.process()));
        }
        let config = &self.loaded.config;
        if let Some(fuel) = tight.fuel {
            ensure!(
                config.fuel.is_some(),
                "the spawner runs under a `fuel` budget of {fuel} units, and this runtime meters no fuel \
                 (give it a fuel budget)"
            );
        }
        let mut limits = ProcessLimits::new(config, tight.max_memory, tight.time_slice);
        limits.fuel = tight.fuel;
        limits.cpu_budget = tight.cpu_budget;
        limits.cpu_budget_ticks = tight.cpu_budget.map_or(u64::MAX, |budget| config.ticks(budget));
        Ok(Box::new(WasmProcess::new(self.loaded.clone(), limits)))
    }
}
