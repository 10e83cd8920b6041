//! `wasmproc compile`: precompiles a program into a file `run` loads without compiling.

use std::process::ExitCode;

use super::output::eprint_now;
use super::{CompileArgs, Exit, Failure, read_app, runtime};

pub(super) fn compile(args: CompileArgs) -> Result<ExitCode, Failure> {
    let bytes = read_app(&args.app, args.engine.max_module_size as u64)?;
    // Compiling instantiates nothing: one arena slot, not `max_instances`' address space
    // (which an address-space limit, `ulimit -v`, would refuse).
    let runtime = runtime(args.engine.config().max_instances(1))?;
    let compiled = runtime.precompile(&bytes).map_err(|e| Failure::from_error(Exit::BadModule, &e))?;
    let output = args.output.unwrap_or_else(|| args.app.with_extension("cwasm"));
    if output == args.app {
        return Err(Failure::new(
            Exit::Usage,
            format!("refusing to overwrite the input `{}`: pass another --output", args.app.display()),
        ));
    }
    std::fs::write(&output, &compiled)
        .map_err(|e| Failure::new(Exit::Usage, format!("cannot write `{}`: {e}", output.display())))?;
    eprint_now(&format!(
        "compiled `{}` into `{}` ({} bytes); run it with `wasmproc run {}`",
        args.app.display(),
        output.display(),
        compiled.len(),
        output.display()
    ));
    Ok(Exit::Success.into())
}
