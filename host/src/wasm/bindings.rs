//! Host bindings of the `wasmproc:process/process` world, generated from `wit/`.
//!
//! Twice: [`Process`] calls every export synchronously; [`preemptible::Process`] calls
//! them on a fiber, which lets a step past its time slice be suspended and resumed
//! (`process.rs`). The second shares the first's types and host traits.

// The generated items mirror the documented WIT; they are crate-private.
wasmtime::component::bindgen!({
    world: "process",
    path: "../wit",
});

pub(crate) mod preemptible {
    wasmtime::component::bindgen!({
        world: "process",
        path: "../wit",
        exports: { default: async },
        with: {
            "wasmproc:process/types": super::wasmproc::process::types,
            "wasmproc:process/host": super::wasmproc::process::host,
        },
    });
}
