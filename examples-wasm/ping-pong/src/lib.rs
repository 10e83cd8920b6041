//! Two processes of one component playing catch with messages.

use wasmproc_guest::prelude::*;

/// Spawns a `pong` process, sends it `n` pings and checks each answer, then stops it and
/// checks it answered them all. Returns `n`.
#[entry]
async fn main(ctx: Ctx, n: u32) -> Result<u32> {
    let pong = ctx.spawn("pong", ()).await?;
    for i in 0..n {
        ctx.send(pong, "ping", i)?;
        let answer: u32 = ctx.recv_topic("pong").await?.decode()?;
        ensure!(answer == i, "pong answered {answer} to ping {i}");
    }
    ctx.send(pong, "stop", ())?;
    let answered: u32 = ctx.wait(pong).await?;
    ensure!(answered == n, "pong answered {answered} pings of {n}");
    Ok(n)
}

/// Answers every `ping` with a `pong` carrying the same number, until a `stop`. Returns
/// how many pings it answered. At shutdown the receive fails, and so does the process,
/// with the cancellation as its error.
#[entry]
async fn pong(ctx: Ctx, _: ()) -> Result<u32> {
    let mut answered = 0;
    loop {
        let message = ctx.recv().await?;
        match message.topic.as_str() {
            "ping" => {
                ctx.send(message.sender, "pong", message.decode::<u32>()?)?;
                answered += 1;
            }
            "stop" => return Ok(answered),
            other => bail!("unexpected `{other}` message from process {}", message.sender),
        }
    }
}

wasmproc_guest::export!(main, pong);
