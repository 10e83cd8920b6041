//! `wasmproc`: runs Wasm processes from the command line. `wasmproc --help` explains
//! every subcommand; the README has the reference.

mod cli;

// Workflows' long-lived records apart from their instances' short-lived memory.
#[global_allocator]
static ALLOCATOR: wasmproc::heap::Segregating = wasmproc::heap::Segregating::new();

fn main() -> std::process::ExitCode {
    wasmproc::heap::tune_system_allocator();
    cli::main()
}
