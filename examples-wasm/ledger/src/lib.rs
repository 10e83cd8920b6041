//! A provider with a side effect outside the journal: every `ledger.record` it serves is
//! appended to `/ledger/records.txt` (a directory granted with `--dir-rw DIR::/ledger`)
//! as one line, `KEY VALUE`, before it is answered. The key is the request's idempotency
//! key: the same each time a durable process's command is carried out, so the file shows
//! which commands a crash made the host carry out again.
//!
//! ```text
//! wasmproc run durable.wasm --method ledgered --journal ./journal \
//!     --provider ledger=ledger.wasm --dir-rw ./out::/ledger
//! ```

use wasmproc_guest::prelude::*;

const FILE: &str = "/ledger/records.txt";

/// Serves `ledger.record` until the host stops the run.
#[entry]
async fn serve(ctx: Ctx, _input: ()) -> Result<()> {
    loop {
        let Ok(request) = ctx.next_request().await else {
            return Ok(());
        };
        let value: serde_json::Value = match request.decode() {
            Ok(value) => value,
            Err(error) => {
                request.respond::<()>(Err(error))?;
                continue;
            }
        };
        let key = request.idempotency_key.clone().unwrap_or_else(|| "-".to_owned());
        let recorded = ctx.fs().append(FILE, &format!("{key} {value}\n")).await;
        request.respond(recorded.map(|()| value))?;
    }
}

wasmproc_guest::export!(serve);
