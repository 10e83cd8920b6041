//! Two entry methods in one component: `greet` and `add`.

use wasmproc_guest::prelude::*;

/// Greets `name`.
#[entry]
async fn greet(_ctx: Ctx, name: String) -> Result<String> {
    Ok(format!("hello, {name}"))
}

/// Adds two numbers; an overflow is the process's error result.
#[entry]
async fn add(_ctx: Ctx, (a, b): (i64, i64)) -> Result<i64> {
    a.checked_add(b).with_context(|| format!("{a} + {b} overflows an i64"))
}

wasmproc_guest::export!(greet, add);
