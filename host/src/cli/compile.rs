//! `wasmproc compile`: precompiles a program into a file `run` loads without compiling.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::input::read_app;
use super::output::{Say, say_now};
use super::{EngineArgs, Exit, Failure, runtime};

/// `wasmproc compile`'s flags.
#[derive(Args, Debug)]
pub(super) struct Compile {
    /// The program to compile (Wasm, or its text format: a .wat file).
    #[arg(value_name = "APP.wasm")]
    app: PathBuf,
    /// Where to write the precompiled file. [default: APP.cwasm beside the input]
    #[arg(long, short, value_name = "OUT")]
    output: Option<PathBuf>,
    /// Compile for runs with these settings: `run` must agree on fuel metering (--fuel
    /// given or not), or it refuses the file and says so.
    #[command(flatten)]
    engine: EngineArgs,
}

impl Compile {
    /// Compiles the program and writes the precompiled file.
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let bytes = read_app(&self.app, self.engine.max_module_size as u64)?;
        // Compiling instantiates nothing: one arena slot, not `max_instances`' address space
        // (which an address-space limit, `ulimit -v`, would refuse).
        let runtime = runtime(self.engine.config()?.max_instances(1))?;
        runtime.name_source(&bytes, &self.app);
        let compiled = runtime.precompile(&bytes).map_err(|e| Failure::from_error(Exit::BadModule, &e))?;
        let output = self.output.unwrap_or_else(|| self.app.with_extension("cwasm"));
        if output == self.app {
            return Err(Failure::new(
                Exit::Usage,
                format!("refusing to overwrite the input `{}`: pass another --output", self.app.display()),
            ));
        }
        std::fs::write(&output, &compiled)
            .map_err(|e| Failure::new(Exit::Usage, format!("cannot write `{}`: {e}", output.display())))?;
        say_now(
            Say::Notice,
            &format!(
                "compiled `{}` into `{}` ({} bytes); run it with `wasmproc run {}`",
                self.app.display(),
                output.display(),
                compiled.len(),
                output.display()
            ),
        );
        Ok(Exit::Success.into())
    }
}
