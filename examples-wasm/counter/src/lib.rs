//! A workflow for `wasmproc serve`: a counter that answers requests and takes typed
//! signals, and a few entries that show the rest of what a workflow has (its id, its
//! logs, a timer it waits on). The service's tests run each entry.
//!
//! Entries:
//! - `counter`: input the starting count. Until the signal `stop`, it answers the requests
//!   `get` (the count), `add` (body `{"by": N}`: adds, answers the new count) and any other
//!   topic with an error naming it; the signal `add` (body `{"by": N}`) adds, and a body of
//!   another shape is logged as a warning and skipped. Each change is logged. Completes
//!   with the count.
//! - `mute`: takes one request and completes with its topic without answering it.
//! - `whoami`: completes with its workflow id and the one its child sees: `[id, id]`.
//! - `chatty`: input `n`; logs `n` numbered lines, has a child log one, then waits for the
//!   signal `stop`, logs `bye` and completes.
//! - `nap`: input milliseconds; sleeps that long and completes with `"rested"`.
//! - `slow`: until the signal `stop`, answers each request (body `{"ms": N}`) after
//!   sleeping N ms, with how many it has answered; completes with that count.

use serde::Deserialize;
use wasmproc_guest::prelude::*;

/// The body of `add`, as a request or a signal.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Add {
    by: u64,
}

#[entry]
async fn counter(ctx: Ctx, start: u64) -> Result<u64> {
    let mut count = start;
    log::info!("counting from {count} in workflow {}", ctx.workflow_id().unwrap_or("(none)"));
    loop {
        let signals = select(ctx.recv_signal::<Add>("add"), ctx.recv_topic("stop"));
        match select(ctx.next_workflow_request(), signals).await {
            Either::Left(request) => {
                let request = request?;
                let answer = match request.topic.as_str() {
                    "get" => Ok(count),
                    "add" => match request.decode::<Add>() {
                        Ok(add) => {
                            count += add.by;
                            log::info!("request {} added {}: {count}", request.id, add.by);
                            Ok(count)
                        }
                        Err(error) => Err(anyhow!(error)),
                    },
                    other => Err(anyhow!("no such request `{other}`: ask `get` or `add`")),
                };
                request.respond(answer).await?;
            }
            Either::Right(Either::Left(Ok(add))) => {
                count += add.by;
                log::info!("signal added {}: {count}", add.by);
            }
            Either::Right(Either::Left(Err(Error::Payload(why)))) => log::warn!("skipped a signal: {why}"),
            Either::Right(Either::Left(Err(other))) => return Err(other.into()),
            Either::Right(Either::Right(stop)) => {
                stop?;
                log::info!("stopped at {count}");
                return Ok(count);
            }
        }
    }
}

#[entry]
async fn mute(ctx: Ctx, _: ()) -> Result<String> {
    let request = ctx.next_workflow_request().await?;
    Ok(request.topic)
}

#[entry]
async fn whoami(ctx: Ctx, _: ()) -> Result<Vec<Option<String>>> {
    let child = ask_id::spawn(&ctx, ()).await?;
    let childs = child.join().await?;
    Ok(vec![ctx.workflow_id().map(str::to_owned), childs])
}

#[entry]
async fn ask_id(ctx: Ctx, _: ()) -> Result<Option<String>> {
    Ok(ctx.workflow_id().map(str::to_owned))
}

#[entry]
async fn chatty(ctx: Ctx, n: u64) -> Result<()> {
    for i in 0..n {
        log::info!("line {i} of {n}");
    }
    let child = chatty_child::spawn(&ctx, ()).await?;
    child.join().await?;
    ctx.recv_topic("stop").await?;
    log::info!("bye");
    Ok(())
}

#[entry]
async fn chatty_child(_ctx: Ctx, _: ()) -> Result<()> {
    log::info!("a child's line");
    Ok(())
}

#[entry]
async fn nap(ctx: Ctx, ms: u64) -> Result<String> {
    ctx.sleep(Duration::from_millis(ms)).await?;
    Ok("rested".to_owned())
}

/// The body of a request to `slow`.
#[derive(Deserialize)]
struct Nap {
    ms: u64,
}

#[entry]
async fn slow(ctx: Ctx, _: ()) -> Result<u64> {
    let mut answered = 0;
    loop {
        match select(ctx.next_workflow_request(), ctx.recv_topic("stop")).await {
            Either::Left(request) => {
                let request = request?;
                let nap: Nap = request.decode()?;
                ctx.sleep(Duration::from_millis(nap.ms)).await?;
                answered += 1;
                request.respond(Ok::<_, Error>(answered)).await?;
            }
            Either::Right(stop) => {
                stop?;
                return Ok(answered);
            }
        }
    }
}

wasmproc_guest::export!(counter, mute, whoami, ask_id, chatty, chatty_child, nap, slow);
