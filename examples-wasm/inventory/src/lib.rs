//! The inventory service of the `workflow` example, written as a provider: run it with
//! `wasmproc run workflow.wasm --provider inventory=inventory.wasm` and every
//! `inventory.reserve` the workflow yields reaches this component's `serve` as a request.
//!
//! The stock lives in the provider process, so it lasts as long as the run: every item
//! starts with [`STOCK`] units. A request that asks for more than is left fails, naming
//! what is left; the workflow retries it, and gives up after its tries.

use std::collections::HashMap;

use serde::Deserialize;
use wasmproc_guest::prelude::*;

/// Units of every item at the start.
const STOCK: u32 = 10;

/// What `inventory.reserve` takes: the workflow's order.
#[derive(Deserialize)]
struct Order {
    item: String,
    quantity: u32,
}

/// Serves `inventory.*` until the host stops the run.
#[entry]
async fn serve(ctx: Ctx, _input: ()) -> Result<()> {
    let mut left: HashMap<String, u32> = HashMap::new();
    let mut next = 1000;
    loop {
        // Cancelled at the end of the run: the error ends the loop, and the provider.
        let Ok(request) = ctx.next_request().await else {
            return Ok(());
        };
        let answer = match request.command.as_str() {
            "inventory.reserve" => request.decode::<Order>().and_then(|order| {
                let stock = left.entry(order.item.clone()).or_insert(STOCK);
                ensure!(order.quantity <= *stock, "out of stock: {} of `{}` left", stock, order.item);
                *stock -= order.quantity;
                next += 1;
                Ok(format!("R-{next}"))
            }),
            other => Err(anyhow!("unknown command `{other}`: the inventory serves inventory.reserve")),
        };
        request.respond(answer)?;
    }
}

wasmproc_guest::export!(serve);
// Answering requests yields no command.
wasmproc_guest::uses!();
