//! The guest SDK for wasmproc processes (see the Wasm processes work in progress).
#![deny(missing_docs)]
