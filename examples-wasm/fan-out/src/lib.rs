//! Work spread over child processes, one per item, and gathered back in order; or handed
//! to one child of another kind.

use wasmproc_guest::prelude::*;

/// Spawns `n` `square` children at once, for 0 to `n - 1`, and returns their results in
/// that order. Any `n`: the spawns past the host's per-step limit go out in later steps.
#[entry]
async fn main(ctx: Ctx, n: u32) -> Result<Vec<u64>> {
    let children = join_all((0..n).map(|i| square::spawn(&ctx, u64::from(i)))).await?;
    Ok(join_all(children.into_iter().map(|child| child.join())).await?)
}

/// `i` squared.
#[entry]
async fn square(_ctx: Ctx, i: u64) -> Result<u64> {
    i.checked_mul(i).with_context(|| format!("{i} squared overflows a u64"))
}

/// Runs `method` of a child of the registered kind `kind` with `input` and returns the
/// child's result: a supervisor's one piece of work. The child gets the spawner's grants,
/// no more, so what it may do is bounded by what this process may do.
#[entry]
async fn delegate(ctx: Ctx, (kind, method, input): (String, String, serde_json::Value)) -> Result<serde_json::Value> {
    let child = ctx.spawn_kind(&kind, &method, input).await?;
    ctx.wait(child).await.with_context(|| format!("the `{kind}` child running `{method}` failed"))
}

wasmproc_guest::export!(main, square, delegate);
