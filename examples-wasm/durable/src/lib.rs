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
    run(ctx, input, "worker", None).await
}

/// As `main`, with workers that record each answer through the `ledger.record` command
/// before they send it: a side effect outside the journal, for a provider to keep
/// (`examples-wasm/ledger`).
#[entry]
async fn ledgered(ctx: Ctx, input: Option<(u32, u32)>) -> Result<u64> {
    run(ctx, input, "ledgered_worker", None).await
}

/// As `main` with the input `[workers, rounds, url]`, with workers that post each answer
/// (`POST url`, the answer as its JSON body) before they send it: a side effect outside
/// the journal, which a crash may make the host carry out again, always with the same
/// `Idempotency-Key` header (the `http` provider's).
#[entry]
async fn posted(ctx: Ctx, input: (u32, u32, String)) -> Result<u64> {
    let (workers, rounds, url) = input;
    run(ctx, Some((workers, rounds)), "posted_worker", Some(url)).await
}

async fn run(ctx: Ctx, input: Option<(u32, u32)>, worker: &str, url: Option<String>) -> Result<u64> {
    let (workers, rounds) = input.unwrap_or((4, 5));
    let mut children = Vec::new();
    for _ in 0..workers {
        children.push(ctx.spawn(worker, &url).await?);
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

/// Receives `n` messages, from anyone, and returns each one's topic and body (a number)
/// in the order they came: what a test of delivery order reads.
#[entry]
async fn gather(ctx: Ctx, n: u32) -> Result<Vec<(String, u64)>> {
    let mut got = Vec::new();
    for _ in 0..n {
        let message = ctx.recv().await?;
        let body: u64 = message.decode()?;
        got.push((message.topic, body));
    }
    Ok(got)
}

/// Answers each `n` message with n², after a 5 ms sleep, until `stop`; returns how many
/// it answered.
#[entry]
async fn worker(ctx: Ctx, _: ()) -> Result<u64> {
    serve(ctx, Effect::None).await
}

/// As `worker`, recording each answer with `ledger.record` first.
#[entry]
async fn ledgered_worker(ctx: Ctx, _: ()) -> Result<u64> {
    serve(ctx, Effect::Ledger).await
}

/// As `worker`, posting each answer to `url` first.
#[entry]
async fn posted_worker(ctx: Ctx, url: String) -> Result<u64> {
    serve(ctx, Effect::Post(url)).await
}

/// What a worker does with an answer before it sends it.
enum Effect {
    None,
    Ledger,
    Post(String),
}

async fn serve(ctx: Ctx, effect: Effect) -> Result<u64> {
    let mut answered = 0;
    loop {
        let message = ctx.recv().await?;
        match message.topic.as_str() {
            "n" => {
                let n: u64 = message.decode()?;
                ctx.sleep(Duration::from_millis(5)).await?;
                match &effect {
                    Effect::None => {}
                    Effect::Ledger => {
                        let recorded: u64 = ctx.call("ledger.record", n * n).await?;
                        ensure!(recorded == n * n, "the ledger recorded {recorded}, not {}", n * n);
                    }
                    Effect::Post(url) => {
                        let response = ctx.http().post_json(url, &(n * n)).await?;
                        ensure!(response.status == 200, "`POST {url}` answered {}", response.status);
                    }
                }
                ctx.send(message.sender, "answer", n * n)?;
                answered += 1;
            }
            "stop" => return Ok(answered),
            other => bail!("unexpected `{other}` message from process {}", message.sender),
        }
    }
}

/// With the input `[senders, count]`: takes `count` messages `n` from each of `senders`
/// processes (each the numbers 1 to `count`, in order, from `source`s, which may run on
/// other shards of a cluster), checking that each sender's come in order, none missing
/// and none twice. Returns how many it took.
#[entry]
async fn sink(ctx: Ctx, input: (u32, u32)) -> Result<u64> {
    let (senders, count) = input;
    let expected = u64::from(senders) * u64::from(count);
    let mut last: HashMap<Pid, u64> = HashMap::new();
    let mut taken = 0;
    while taken < expected {
        let message = ctx.recv_topic("n").await?;
        let n: u64 = message.decode()?;
        let before = last.entry(message.sender).or_default();
        ensure!(n == *before + 1, "message {n} of process {} came after its message {before}", message.sender);
        ensure!(n <= u64::from(count), "message {n} of process {} is past the {count} it sends", message.sender);
        *before = n;
        taken += 1;
    }
    ensure!(last.len() == senders as usize, "{} senders, not {senders}", last.len());
    Ok(taken)
}

/// With the input `[sinks, count]`: sends each of the processes `sinks` the numbers 1 to
/// `count` as messages `n`, in order, sleeping 5 ms after every 4th round so that a crash
/// can land among them. Returns how many it sent.
#[entry]
async fn source(ctx: Ctx, input: (Vec<Pid>, u32)) -> Result<u64> {
    let (sinks, count) = input;
    let mut sent = 0;
    for n in 1..=u64::from(count) {
        for &sink in &sinks {
            ctx.send(sink, "n", n)?;
            sent += 1;
        }
        if n % 4 == 0 {
            ctx.sleep(Duration::from_millis(5)).await?;
        }
    }
    Ok(sent)
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

wasmproc_guest::export!(main, worker, ledgered, ledgered_worker, posted, posted_worker, sink, source, stubborn, gather);
