//! The demo the README runs: every example guest, built from source by this crate's build
//! script for `wasm32-wasip2`, loaded as a component and run as processes on one
//! scheduler. The demo itself is `wasmproc_tests::demo`, which a test runs too.
//!
//! `cargo run --release -p wasmproc-tests --example demo`

fn main() -> anyhow::Result<()> {
    wasmproc_tests::demo::run(wasmproc::wasm::Config::default(), &mut std::io::stdout().lock())
}
