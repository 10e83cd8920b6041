//! Work spread over child processes, one per item, and gathered back in order.

use wasmproc_guest::prelude::*;

/// Spawns `n` `square` children at once, for 0 to `n - 1`, and returns their results in
/// that order.
#[entry]
async fn main(ctx: Ctx, n: u32) -> Result<Vec<u64>> {
    let kids = join_all((0..n).map(|i| ctx.spawn("square", i))).await?;
    let mut out = Vec::with_capacity(kids.len());
    for kid in kids {
        out.push(ctx.wait::<u64>(kid).await?);
    }
    Ok(out)
}

/// `i` squared.
#[entry]
async fn square(_ctx: Ctx, i: u64) -> Result<u64> {
    i.checked_mul(i).with_context(|| format!("{i} squared overflows a u64"))
}

wasmproc_guest::export!(main, square);
