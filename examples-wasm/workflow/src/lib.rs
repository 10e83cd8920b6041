//! A multi-step job: reserve stock through the embedder's `inventory.reserve` command,
//! retrying failures, then report what happened.

use serde::{Deserialize, Serialize};
use wasmproc_guest::prelude::*;

/// Tries of `inventory.reserve` before the job gives up.
const ATTEMPTS: u32 = 3;

/// The pause between two tries. Short, because the tests wait for it; a real job would
/// back off for longer.
const BACKOFF: Duration = Duration::from_millis(10);

/// What to reserve; also the input of `inventory.reserve`.
#[derive(Serialize, Deserialize)]
struct Order {
    item: String,
    quantity: u32,
}

/// The job's result.
#[derive(Serialize, Deserialize)]
struct Summary {
    item: String,
    quantity: u32,
    /// What `inventory.reserve` answered.
    reservation: String,
    /// Tries it took, 1 to `ATTEMPTS`.
    attempts: u32,
}

/// Reserves `order`, trying `inventory.reserve` up to `ATTEMPTS` times with a pause
/// between tries, and summarises the outcome. Fails with the last error if every try
/// failed.
#[entry]
async fn main(ctx: Ctx, order: Order) -> Result<Summary> {
    ensure!(order.quantity > 0, "nothing to reserve: the quantity of `{}` is 0", order.item);
    let mut attempt = 1;
    let reservation = loop {
        match ctx.call::<String>("inventory.reserve", &order).await {
            Ok(reservation) => break reservation,
            Err(error) if attempt < ATTEMPTS => {
                ctx.log(Level::Warn, &format!("try {attempt} of {ATTEMPTS} failed, retrying: {error:#}"));
                ctx.sleep(BACKOFF).await?;
                attempt += 1;
            }
            Err(error) => {
                return Err(error).context(format!("gave up reserving `{}` after {ATTEMPTS} tries", order.item));
            }
        }
    };
    ctx.log(Level::Info, &format!("reserved {} of `{}` as {reservation}", order.quantity, order.item));
    Ok(Summary { item: order.item, quantity: order.quantity, reservation, attempts: attempt })
}

wasmproc_guest::export!(main);
wasmproc_guest::uses!("inventory.reserve", "sleep");
