//! The guest SDK's features, one entry each, with results the tests check: typed errors,
//! cancellation of every wait, `ctx.timeout`, `ctx.parent`, `select_any`, typed spawning,
//! links and trapped exits, and the `log` backend; and what the host shows of a guest's output and panics. (`fan-out`
//! shows many spawns past the per-step limit.)

use wasmproc_guest::prelude::*;

/// How a wait ended, as one word or the cancellation's text.
fn ending<T>(waited: Result<T, Error>) -> String {
    match waited {
        Ok(_) => "done".to_owned(),
        Err(Error::Cancelled(reason)) => format!("cancelled ({reason})"),
        Err(Error::Timeout(after)) => format!("timeout ({after:?})"),
        Err(other) => format!("other: {other}"),
    }
}

/// Waits in every way at once, for 10 s or a message that never comes, and reports how
/// each wait ended: under a cancel, each fails with it at once.
#[entry]
async fn patient(ctx: Ctx, _: ()) -> Result<Vec<String>> {
    let forever = std::future::pending::<()>();
    let ((slept, received), timed) = join(
        join(ctx.sleep(Duration::from_secs(10)), ctx.recv()),
        ctx.timeout(Duration::from_secs(10), forever),
    )
    .await;
    Ok(vec![ending(slept), ending(received), ending(timed)])
}

/// Waits at most `ms` milliseconds for a message.
#[entry]
async fn deadline(ctx: Ctx, ms: u64) -> Result<String> {
    Ok(ending(ctx.timeout(Duration::from_millis(ms), ctx.recv()).await))
}

/// Sleeps each length (in milliseconds) at once; the index of the first to finish.
#[entry]
async fn race(ctx: Ctx, lengths: Vec<u64>) -> Result<usize> {
    let (first, slept) = select_any(lengths.into_iter().map(|ms| ctx.sleep(Duration::from_millis(ms)))).await;
    slept?;
    Ok(first)
}

/// This process's pid and parent, and the parent its typed child reports.
#[entry]
async fn family(ctx: Ctx, _: ()) -> Result<(u64, Option<u64>, Option<u64>)> {
    let child = whose_child::spawn(&ctx, ()).await?;
    let childs_parent = child.join().await?;
    Ok((ctx.pid().as_u64(), ctx.parent().map(Pid::as_u64), childs_parent))
}

/// The parent of this process.
#[entry]
async fn whose_child(ctx: Ctx, _: ()) -> Result<Option<u64>> {
    Ok(ctx.parent().map(Pid::as_u64))
}

/// Sends `n` messages to a child that never reads them, and then one to `nobody`; the
/// typed error of each send that failed, with its number.
#[entry]
async fn flood(ctx: Ctx, (n, nobody): (u32, u64)) -> Result<Vec<(u32, String)>> {
    let deaf = deaf::spawn(&ctx, ()).await?;
    let mut refused = Vec::new();
    let mut note = |i, sent: Result<(), Error>| match sent {
        Ok(()) => {}
        Err(Error::MailboxFull(pid)) if pid == deaf.pid() => refused.push((i, "mailbox full".to_owned())),
        Err(Error::NoProc(pid)) if pid.as_u64() == nobody => refused.push((i, "noproc".to_owned())),
        Err(other) => refused.push((i, format!("other: {other}"))),
    };
    for i in 1..=n {
        note(i, ctx.send(deaf.pid(), "noise", i));
    }
    note(n + 1, ctx.send(Pid::from_u64(nobody), "hello", ()));
    ctx.terminate(deaf.pid()).await?;
    Ok(refused)
}

/// Spawns a `deaf` child and a `terminator` of it, its sibling: what the sibling's
/// `terminate` answered (a process may end its own children, and others only when
/// granted `terminate`); then ends the deaf child itself if its sibling could not.
#[entry]
async fn sibling_terminates(ctx: Ctx, _: ()) -> Result<String> {
    let deaf = deaf::spawn(&ctx, ()).await?;
    let answer = terminator::spawn(&ctx, deaf.pid().as_u64()).await?.join().await?;
    if answer != "terminated" {
        ctx.terminate(deaf.pid()).await?;
    }
    Ok(answer)
}

/// Terminates `pid`: `terminated`, or why not.
#[entry]
async fn terminator(ctx: Ctx, pid: u64) -> Result<String> {
    Ok(match ctx.terminate(Pid::from_u64(pid)).await {
        Ok(()) => "terminated".to_owned(),
        Err(error) => error.to_string(),
    })
}

/// Reads nothing; waits to be cancelled or terminated.
#[entry]
async fn deaf(ctx: Ctx, _: ()) -> Result<()> {
    ctx.cancelled().await;
    Ok(())
}

/// Logs through the `log` crate, at two levels.
#[entry]
async fn chatty(_ctx: Ctx, name: String) -> Result<()> {
    log::info!("hello, {name}");
    log::warn!("a line without arguments");
    Ok(())
}

/// Spawns a `deaf` child and waits for its exit, which comes only once it is cancelled.
#[entry]
async fn parent_of_deaf(ctx: Ctx, _: ()) -> Result<()> {
    let child = deaf::spawn(&ctx, ()).await?;
    child.join().await?;
    Ok(())
}

/// Writes `text` as it is to stdout and stderr, logs it, and fails with it as its error:
/// what the host shows of a guest's words, whatever they hold.
#[entry]
async fn echo(_ctx: Ctx, text: String) -> Result<()> {
    println!("{text}");
    eprintln!("{text}");
    log::info!("{text}");
    bail!("{text}")
}

/// Element `i` of a vector of three: past its end, a panic (`index out of bounds`).
#[entry]
async fn element(_ctx: Ctx, i: usize) -> Result<u32> {
    let three = std::hint::black_box(vec![1, 2, 3]);
    Ok(three[i])
}

/// Links: traps exits, spawns a linked `fails` and links to `nobody` (a pid that does not
/// exist), and reports each trapped exit as it comes, `(pid, reason's name)`, with the
/// child's pid.
#[entry]
async fn trapping(ctx: Ctx, nobody: u64) -> Result<(u64, Vec<(u64, String)>)> {
    ctx.trap_exits(true).await?;
    let child = fails::spawn_link(&ctx, "boom".to_owned()).await?;
    ctx.link(Pid::from_u64(nobody)).await?;
    let mut exits = Vec::new();
    while exits.len() < 2 {
        let exit = ctx.recv_exit().await?;
        exits.push((exit.pid.as_u64(), exit.reason.name().to_owned()));
    }
    exits.sort();
    Ok((child.pid().as_u64(), exits))
}

/// Spawns a linked `fails` without trapping exits: the child's error ends this process.
#[entry]
async fn linked_to_failure(ctx: Ctx, _: ()) -> Result<()> {
    let _child = fails::spawn_link(&ctx, "the linked child failed".to_owned()).await?;
    ctx.recv().await?;
    bail!("outlived its linked child")
}

/// Spawns a linked `fails_after(ms)` and waits for a message that never comes: the
/// child's failure ends it (a durable run resumed in between included).
#[entry]
async fn linked_pair(ctx: Ctx, ms: u64) -> Result<()> {
    let _child = fails_after::spawn_link(&ctx, ms).await?;
    ctx.recv().await?;
    bail!("outlived its linked child")
}

/// Sleeps `ms` milliseconds, then fails.
#[entry]
async fn fails_after(ctx: Ctx, ms: u64) -> Result<()> {
    ctx.sleep(Duration::from_millis(ms)).await?;
    bail!("the linked child failed after {ms} ms")
}

/// Fails with `error` as its error.
#[entry]
async fn fails(_ctx: Ctx, error: String) -> Result<()> {
    bail!("{error}")
}

/// Writes `value` under `key` in the key-value store the host grants; answers the
/// version written.
#[entry]
async fn remember(ctx: Ctx, (key, value): (String, String)) -> Result<u64> {
    Ok(ctx.kv().put(&key, &value).await?)
}

/// The value under `key` in the key-value store the host grants, or nothing.
#[entry]
async fn recall(ctx: Ctx, key: String) -> Result<Option<String>> {
    Ok(ctx.kv().get::<String>(&key).await?.map(|found| found.value))
}

wasmproc_guest::export!(
    patient,
    deadline,
    race,
    family,
    whose_child,
    flood,
    sibling_terminates,
    terminator,
    deaf,
    chatty,
    parent_of_deaf,
    echo,
    element,
    trapping,
    linked_to_failure,
    linked_pair,
    fails_after,
    fails,
    remember,
    recall
);
wasmproc_guest::uses!(remember: "kv.put");
wasmproc_guest::uses!(recall: "kv.get");
