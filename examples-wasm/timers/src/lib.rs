//! Sleeps of several lengths at once: they finish shortest first, whatever the order they
//! started in, which only happens if they really run concurrently.

use std::cell::RefCell;

use wasmproc_guest::prelude::*;

/// The lengths slept when the input gives none, in milliseconds.
const DEFAULT_MS: [u64; 3] = [30, 10, 20];

/// Sleeps each length of `lengths_ms` (default 30, 10, 20) at once and returns the lengths
/// in the order their sleeps finished.
#[entry]
async fn main(ctx: Ctx, lengths_ms: Option<Vec<u64>>) -> Result<Vec<u64>> {
    let finished = RefCell::new(Vec::new());
    let nap = |ms: u64| {
        let (ctx, finished) = (&ctx, &finished);
        async move {
            ctx.sleep(Duration::from_millis(ms)).await?;
            finished.borrow_mut().push(ms);
            Ok::<_, Error>(())
        }
    };
    join_all(lengths_ms.unwrap_or(DEFAULT_MS.to_vec()).into_iter().map(nap)).await?;
    Ok(finished.into_inner())
}

wasmproc_guest::export!(main);
