//! `wasmproc`: runs Wasm processes from the command line. `wasmproc --help` explains
//! every subcommand; the README has the reference.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
