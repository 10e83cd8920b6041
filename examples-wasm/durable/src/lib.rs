//! A workflow to run durably (`wasmproc run durable.wasm --journal DIR`): it waits on
//! timers, spawns children and exchanges messages with them, and its result is the same
//! however often the host is killed and the run resumed.
//!
//! It also reads the clock and random numbers (through std's `HashMap`, whose order
//! is seeded from them): a durable process reads the values its journal recorded, so a
//! replay takes the same path.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use wasmproc_guest::prelude::*;

/// Spawns `workers` (default 4) `worker`s, sends each the numbers 1 to `rounds` (default
/// 5) one message at a time, waiting for each answer and sleeping 20 ms between rounds
/// (logging `round R of N` as each begins), then stops them. Returns the sum of every answer and of every worker's result.
#[entry]
async fn main(ctx: Ctx, input: Option<(u32, u32)>) -> Result<u64> {
    run(ctx, input, "worker").await
}

/// As `main`, with workers that record each answer through the `ledger.record` command
/// before they send it: a side effect outside the journal, for a provider to keep
/// (`examples-wasm/ledger`).
#[entry]
async fn ledgered(ctx: Ctx, input: Option<(u32, u32)>) -> Result<u64> {
    run(ctx, input, "ledgered_worker").await
}

async fn run(ctx: Ctx, input: Option<(u32, u32)>, worker: &str) -> Result<u64> {
    let (workers, rounds) = input.unwrap_or((4, 5));
    let mut children = Vec::new();
    for _ in 0..workers {
        children.push(ctx.spawn(worker, ()).await?);
    }
    // The children in the order of a randomly seeded hash map.
    let children: Vec<Pid> = children.iter().map(|&pid| (pid, ())).collect::<HashMap<_, _>>().into_keys().collect();
    let mut total = 0u64;
    for round in 1..=rounds {
        ctx.log(Level::Info, &format!("round {round} of {rounds}"));
        for &child in &children {
            ctx.send(child, "n", round)?;
            let answer: u64 = ctx.recv_topic("answer").await?.decode()?;
            total += answer;
        }
        // 20 to 24 ms, by the clock.
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        ctx.sleep(Duration::from_millis(20 + u64::from(now % 5))).await?;
    }
    for &child in &children {
        ctx.send(child, "stop", ())?;
        let seen: u64 = ctx.wait(child).await?;
        total += seen;
    }
    Ok(total)
}

/// Answers each `n` message with n², after a 5 ms sleep, until `stop`; returns how many
/// it answered.
#[entry]
async fn worker(ctx: Ctx, _: ()) -> Result<u64> {
    serve(ctx, false).await
}

/// As `worker`, recording each answer with `ledger.record` first.
#[entry]
async fn ledgered_worker(ctx: Ctx, _: ()) -> Result<u64> {
    serve(ctx, true).await
}

async fn serve(ctx: Ctx, ledger: bool) -> Result<u64> {
    let mut answered = 0;
    loop {
        let message = ctx.recv().await?;
        match message.topic.as_str() {
            "n" => {
                let n: u64 = message.decode()?;
                ctx.sleep(Duration::from_millis(5)).await?;
                if ledger {
                    let recorded: u64 = ctx.call("ledger.record", n * n).await?;
                    ensure!(recorded == n * n, "the ledger recorded {recorded}, not {}", n * n);
                }
                ctx.send(message.sender, "answer", n * n)?;
                answered += 1;
            }
            "stop" => return Ok(answered),
            other => bail!("unexpected `{other}` message from process {}", message.sender),
        }
    }
}

/// Sleeps 20 ms at a time for ever, and goes on when cancelled: a process that ignores a
/// cancel, for `journal cancel` to terminate once its grace has passed.
#[entry]
async fn stubborn(ctx: Ctx, _: ()) -> Result<u64> {
    loop {
        // Once cancelled, every wait fails at once: this then spins until terminated.
        let _ = ctx.sleep(Duration::from_millis(20)).await;
    }
}

wasmproc_guest::export!(main, worker, ledgered, ledgered_worker, stubborn);
