//! Supervisors started from a guest with the SDK's builder: the host's built-in
//! supervisor, spawned as a process of the kind `supervisor`. The children are this
//! component's own entries, named by the kind it is registered under (`app` in
//! `wasmproc run`), which each entry takes as its input.

use wasmproc_guest::prelude::*;
use wasmproc_guest::supervisor::{Backoff, ChildSpec, Restart, Supervisor, SupervisorRef, Value};

/// Fails at once with `message`: a child in a crash loop.
#[entry]
async fn crash(_ctx: Ctx, message: String) -> Result<()> {
    bail!("{message}")
}

/// Waits for a `get` and answers its sender with `n` doubled (topic `value`), then ends.
#[entry]
async fn double(ctx: Ctx, n: u64) -> Result<()> {
    let request = ctx.recv_topic("get").await?;
    ctx.send(request.sender, "value", n * 2)?;
    Ok(())
}

/// A supervisor whose child crashes at once: restarted twice, after a backoff, and then
/// the supervisor gives up. Answers with the supervisor's error, which names the child.
#[entry]
async fn gives_up(ctx: Ctx, kind: String) -> Result<String> {
    let supervisor = Supervisor::one_for_one()
        .intensity(2, Duration::from_secs(60))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(10)).jitter(0.5))
        .child(ChildSpec::new("crasher", kind, "crash").input("boom"));
    let pid = supervisor.spawn(&ctx).await?;
    match ctx.wait::<Value>(pid).await {
        Err(Error::Failed { reason: ExitReason::Error(error), .. }) => Ok(error),
        other => bail!("the supervisor should give up, got {other:?}"),
    }
}

/// A pool (`simple_one_for_one`) of `double` workers, one started for each input; asks
/// each for its value and answers with the pool's size and the values, in input order.
#[entry]
async fn pool(ctx: Ctx, (kind, inputs): (String, Vec<u64>)) -> Result<(usize, Vec<u64>)> {
    let template = ChildSpec::new("double", kind, "double").restart(Restart::Temporary);
    let pool = SupervisorRef(Supervisor::simple_one_for_one(template).spawn(&ctx).await?);
    let mut workers = Vec::new();
    for n in inputs {
        workers.push(pool.start_child(&ctx, n).await?);
    }
    let size = pool.which_children(&ctx).await?.as_array().map_or(0, Vec::len);
    let mut values = Vec::new();
    for worker in workers {
        ctx.send(worker, "get", ())?;
        values.push(ctx.recv_topic("value").await?.decode()?);
    }
    Ok((size, values))
}

wasmproc_guest::export!(crash, double, gives_up, pool);
