//! Host bindings of the `wasmproc:process/process` world, generated from `wit/`.

// The generated items mirror the documented WIT; they are crate-private.
wasmtime::component::bindgen!({
    world: "process",
    path: "../wit",
});
