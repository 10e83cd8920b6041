//! Host bindings of the `wasmproc:process/process` world, generated from `wit/`.
//!
//! [`Process`] calls `entries` and `init` synchronously; `step` is called through
//! [`Process::step`], synchronously or on a fiber (which lets a step past its time slice be
//! suspended and resumed, `process.rs`), with its output lifted by `output.rs`.

/// The version of the `wasmproc:process` package this host runs.
pub(crate) const VERSION: &str = "0.2.1";

/// The earlier versions this host also runs: 0.2.1 only added `host.wait`, so a
/// component built for 0.2.0 imports a part of 0.2.1, and wasmtime's linker, which
/// matches semver-compatible names, links it to this host's functions unchanged.
const COMPATIBLE: &[&str] = &["0.2.0"];

/// The world every process component must target; named in load errors.
pub(crate) const WORLD: &str = "wasmproc:process/process@0.2.1";

/// The interface of the host functions (`send`, `log`…), as the linker names it.
pub(crate) const HOST_INTERFACE: &str = "wasmproc:process/host@0.2.1";

/// The interface of provider components' `respond`, as the linker names it.
pub(crate) const PROVIDER_INTERFACE: &str = "wasmproc:process/provider@0.2.1";

/// The version of the `wasmproc:process` package a component was built for, when it
/// imports an interface of a version this host does not run (neither [`VERSION`] nor
/// one it is compatible with): a component built for an earlier contract (or a later
/// one) is refused by name rather than by a type mismatch.
pub(crate) fn other_version(component: &wasmtime::component::Component) -> Option<String> {
    let engine = component.engine();
    let ty = component.component_type();
    let names = ty.imports(engine).map(|(name, _)| name).chain(ty.exports(engine).map(|(name, _)| name));
    names
        .filter_map(|name| name.strip_prefix("wasmproc:process/")?.split_once('@').map(|(_, version)| version))
        .find(|version| *version != VERSION && !COMPATIBLE.contains(version))
        .map(str::to_owned)
}

// The generated items mirror the documented WIT; they are crate-private.
wasmtime::component::bindgen!({
    world: "process",
    path: "../wit",
    // A `send` over the payload limit ends the process: the host function traps. `wait`
    // is linked again by `component.rs`, asynchronously; the generated one only refuses.
    imports: { "wasmproc:process/host.send": trappable, "wasmproc:process/host.wait": trappable },
});

/// The `provider` import of the `handler` world: a provider component is a process
/// component that also answers requests, so one linker serves both worlds, and a
/// process component simply leaves this import unused.
pub(crate) mod handler {
    wasmtime::component::bindgen!({
        world: "handler",
        path: "../wit",
        with: {
            "wasmproc:process/types": super::wasmproc::process::types,
            "wasmproc:process/host": super::wasmproc::process::host,
        },
    });
}

impl ProcessIndices {
    /// The exports of `instance`, an instance of the component these indices were made
    /// from, without the type checks of the generated `load`.
    ///
    /// Sound because `ProcessIndices::new` checked the exports' types against the
    /// component, and every instance of a component has its types; the generated `load`
    /// checks them again for every instance (record and variant walks with string
    /// compares, ~3% of a process's lifecycle on the benchmark). The calls themselves
    /// never check: the generated `call_*` make their typed function unchecked.
    pub(crate) fn load_prechecked(
        &self,
        mut store: impl wasmtime::AsContextMut,
        instance: &wasmtime::component::Instance,
    ) -> wasmtime::Result<Process> {
        let mut get = |index: &wasmtime::component::ComponentExportIndex, name: &str| {
            instance.get_func(&mut store, index).ok_or_else(|| wasmtime::format_err!("no export `{name}` found"))
        };
        Ok(Process {
            entries: get(&self.entries, "entries")?,
            init: get(&self.init, "init")?,
            step: get(&self.step, "step")?,
        })
    }
}

/// `step`'s signature with the events lowered from `input.rs`'s types and the output
/// lifted through `output.rs`'s capped ones.
pub(crate) type Step<'a> = wasmtime::component::TypedFunc<(&'a [super::input::Event],), (super::output::StepOutput,)>;

impl Process {
    /// Checks once that the component's `step` has the signature [`Process::step`]
    /// assumes (the generated `load` checked the world's own types, not `input.rs`'s and
    /// `output.rs`'s).
    pub(crate) fn check_step(&self, store: impl wasmtime::AsContext) -> wasmtime::Result<()> {
        self.step.typed::<(&[super::input::Event],), (super::output::StepOutput,)>(store).map(drop)
    }

    /// `entries`, called asynchronously: the only way to call an instance of a component
    /// that imports `wait` (see `waiting.rs`).
    pub(crate) async fn call_entries_async<T: Send>(
        &self,
        store: impl wasmtime::AsContextMut<Data = T>,
    ) -> wasmtime::Result<Vec<String>> {
        // SAFETY: `ProcessIndices::new` checked the export's type against the component,
        // and every instance of a component has its types.
        let entries = unsafe { wasmtime::component::TypedFunc::<(), (Vec<String>,)>::new_unchecked(self.entries) };
        entries.call_async(store, ()).await.map(|(entries,)| entries)
    }

    /// `init`, called asynchronously (see [`Process::call_entries_async`]).
    pub(crate) async fn call_init_async<T: Send>(
        &self,
        store: impl wasmtime::AsContextMut<Data = T>,
        pid: u64,
        method: &str,
        input: &[wasmproc::process::types::Payload],
    ) -> wasmtime::Result<Result<(), String>> {
        type Init<'a> = wasmtime::component::TypedFunc<
            (u64, &'a str, &'a [wasmproc::process::types::Payload]),
            (Result<(), String>,),
        >;
        // SAFETY: as in `call_entries_async`.
        let init = unsafe { Init::new_unchecked(self.init) };
        init.call_async(store, (pid, method, input)).await.map(|(accepted,)| accepted)
    }

    /// `step`, lifting its output with the per-step caps (see `output.rs`).
    pub(crate) fn step<'a>(&self) -> Step<'a> {
        // SAFETY: `check_step` passed on an instance of the same component when it was
        // loaded (`Component::prepare`), and every instance of a component has its types.
        unsafe { Step::new_unchecked(self.step) }
    }
}
