//! A guest that ends its steps in the host's `wait` (`wasmproc:process/host@0.2.1`)
//! instead of returning from `step`, written directly against `wit/` like `bench`: the
//! tests of `wait`'s rules (`tests/all/waiting.rs`) and the benchmarks of a message
//! through it (`tests/benches/all/wasm.rs`) run it.
//!
//! Each call of `step` advances the process and, unless it completed, calls `wait` with
//! the output it would have returned, going on with the events `wait` answers. It returns
//! from `step` only when it completes, when `wait` answers `none` (then with the status
//! it gave `wait` and no yields), or, for an entry given `returns` (a last input payload
//! `returns`), after every step, as a guest without `wait` does.
//!
//! Entries; numbers are `u64`s as 8 little-endian bytes (format `bytes`):
//! - `ping-pong [limit] [peer]?`: `bench`'s, through `wait`;
//! - `cycles [n]`: `bench`'s (a custom command `now` a step), through `wait`;
//! - `idle`: waits for the first message, then completes with the number of times the
//!   host called its `step` export, so a test sees whether the host made it return;
//! - `spin [rounds] [iterations]`: each round computes for `iterations` turns of a loop,
//!   then ends its step with status `continue`; completes with `rounds` after the last;
//! - `flood [n]`: ends its first step with `n` `sleep(0)` yields, blocked; completes
//!   with `n` once all have completed;
//! - `collect [n]`: sums the counters of `n` messages; each message's step yields a
//!   `sleep` of as many nanoseconds as its counter, and it completes with the sum once
//!   all have completed;
//! - `stubborn [how]`: waits idle; when `wait` answers `none` it breaks `wait`'s
//!   contract: `how` 1 returns a yield, 2 calls `wait` again, 3 returns `complete`.
//!
//! A `cancel` event ends any of them at once with the reason as the error.

use std::cell::{Cell, RefCell};

use wasmproc::process::host;
use wasmproc::process::types::{Command, CustomCommand, Status, YieldCommand};

wit_bindgen::generate!({
    world: "process",
    path: "../../wit",
});

const ENTRIES: [&str; 7] = ["ping-pong", "cycles", "idle", "spin", "flood", "collect", "stubborn"];

// A guest instance runs exactly one process, so its state is a global. Wasm is
// single-threaded: the `RefCell` is only ever borrowed by the one export running now.
thread_local! {
    static PROCESS: RefCell<Option<Process>> = const { RefCell::new(None) };
    static RETURNS: Cell<bool> = const { Cell::new(false) };
    /// Calls of the `step` export so far.
    static STEPS: Cell<u64> = const { Cell::new(0) };
}

enum Process {
    PingPong { limit: u64, peer: Option<u64>, started: bool },
    Cycles { n: u64, done: u64 },
    Idle,
    Spin { rounds: u64, iterations: u64, done: u64 },
    Flood { n: u64, done: u64, started: bool },
    Collect { n: u64, received: u64, completed: u64, sum: u64 },
    Stubborn(u64),
}

struct Waiter;

impl Guest for Waiter {
    fn entries() -> Vec<String> {
        ENTRIES.iter().map(|e| e.to_string()).collect()
    }

    fn init(_pid: u64, method: String, mut input: Vec<Payload>) -> Result<(), String> {
        if input.last().is_some_and(|p| p.data == b"returns") {
            input.pop();
            RETURNS.set(true);
        }
        let process = match method.as_str() {
            "ping-pong" => Process::PingPong {
                limit: number(&input, 0, "ping-pong", "limit")?,
                peer: if input.len() > 1 { Some(number(&input, 1, "ping-pong", "peer")?) } else { None },
                started: false,
            },
            "cycles" => Process::Cycles { n: number(&input, 0, "cycles", "n")?, done: 0 },
            "idle" => Process::Idle,
            "spin" => Process::Spin {
                rounds: number(&input, 0, "spin", "rounds")?,
                iterations: number(&input, 1, "spin", "iterations")?,
                done: 0,
            },
            "flood" => Process::Flood { n: number(&input, 0, "flood", "n")?, done: 0, started: false },
            "collect" => Process::Collect { n: number(&input, 0, "collect", "n")?, received: 0, completed: 0, sum: 0 },
            "stubborn" => Process::Stubborn(number(&input, 0, "stubborn", "how")?),
            // The host adds the list of entries.
            other => return Err(format!("unknown entry method `{other}`")),
        };
        PROCESS.with(|p| *p.borrow_mut() = Some(process));
        Ok(())
    }

    fn step(events: Vec<Event>) -> StepOutput {
        STEPS.set(STEPS.get() + 1);
        let mut events = events;
        loop {
            let output = advance(events);
            if matches!(output.status, Status::Complete(_)) || RETURNS.get() {
                return output;
            }
            match host::wait(&output) {
                Some(next) => events = next,
                None => return released(output.status),
            }
        }
    }
}

/// What to return once `wait` answered `none`: `stubborn` breaks the contract.
fn released(status: Status) -> StepOutput {
    let how = PROCESS.with_borrow(|p| match p {
        Some(Process::Stubborn(how)) => *how,
        _ => 0,
    });
    match how {
        1 => StepOutput { status, yields: vec![sleep(0, 0)] },
        2 => {
            let _ = host::wait(&StepOutput { status, yields: vec![] });
            StepOutput { status: Status::Idle, yields: vec![] }
        }
        3 => done(Ok(u64_payload(3))),
        _ => StepOutput { status, yields: vec![] },
    }
}

fn advance(events: Vec<Event>) -> StepOutput {
    if let Some(reason) = events.iter().find_map(|e| if let Event::Cancel(r) = e { Some(r) } else { None }) {
        return done(Err(format!("cancelled: {reason}")));
    }
    PROCESS.with(|p| {
        let mut guard = p.borrow_mut();
        match guard.as_mut().expect("the host calls `init` before `step`") {
            Process::PingPong { limit, peer, started } => ping_pong(*limit, peer, started, events),
            Process::Cycles { n, done: completed } => cycles(*n, completed, events),
            Process::Idle => idle(events),
            Process::Spin { rounds, iterations, done: finished } => spin(*rounds, *iterations, finished),
            Process::Flood { n, done: completed, started } => flood(*n, completed, started, events),
            Process::Collect { n, received, completed, sum } => collect(*n, received, completed, sum, events),
            Process::Stubborn(_) => StepOutput { status: Status::Idle, yields: vec![] },
        }
    })
}

/// Input payload `index` of `method` as a number.
fn number(input: &[Payload], index: usize, method: &str, name: &str) -> Result<u64, String> {
    let bytes = input.get(index).map(|p| p.data.as_slice()).unwrap_or_default();
    let bytes: [u8; 8] = bytes
        .try_into()
        .map_err(|_| format!("`{method}` expects `{name}` (input {index}) as 8 little-endian bytes"))?;
    Ok(u64::from_le_bytes(bytes))
}

fn u64_payload(value: u64) -> Payload {
    Payload { format: "bytes".to_string(), data: value.to_le_bytes().to_vec() }
}

fn done(result: Result<Payload, String>) -> StepOutput {
    StepOutput { status: Status::Complete(result), yields: vec![] }
}

fn sleep(tag: u64, nanos: u64) -> YieldCommand {
    YieldCommand { tag, command: Command::Sleep(nanos) }
}

fn ping_pong(limit: u64, peer: &mut Option<u64>, started: &mut bool, events: Vec<Event>) -> StepOutput {
    let mut next = None;
    if !*started {
        *started = true;
        next = peer.map(|to| (to, 0));
    }
    for event in events {
        if let Event::Message(message) = event {
            let Ok(bytes) = <[u8; 8]>::try_from(message.body.data.as_slice()) else {
                return done(Err(format!("expected a counter of 8 bytes, got {}", message.body.data.len())));
            };
            let count = u64::from_le_bytes(bytes);
            if count >= limit {
                return done(Ok(u64_payload(count)));
            }
            *peer = Some(message.sender);
            next = Some((message.sender, count + 1));
        }
    }
    if let Some((to, count)) = next {
        if let Err(e) = host::send(to, "", &u64_payload(count)) {
            return done(Err(format!("send of {count} failed: {e}")));
        }
        if count >= limit {
            return done(Ok(u64_payload(count)));
        }
    }
    StepOutput { status: Status::Idle, yields: vec![] }
}

fn cycles(n: u64, completed: &mut u64, events: Vec<Event>) -> StepOutput {
    for event in events {
        if let Event::Completion(completion) = event {
            if let Err(e) = completion.result {
                return done(Err(format!("`now` failed: {e}")));
            }
            *completed += 1;
        }
    }
    if *completed >= n {
        return done(Ok(u64_payload(n)));
    }
    let now = CustomCommand { name: "now".to_string(), payload: Payload { format: "bytes".to_string(), data: vec![] } };
    StepOutput {
        status: Status::Blocked,
        yields: vec![YieldCommand { tag: *completed, command: Command::Custom(now) }],
    }
}

fn idle(events: Vec<Event>) -> StepOutput {
    if events.iter().any(|event| matches!(event, Event::Message(_))) {
        return done(Ok(u64_payload(STEPS.get())));
    }
    StepOutput { status: Status::Idle, yields: vec![] }
}

fn spin(rounds: u64, iterations: u64, finished: &mut u64) -> StepOutput {
    if *finished >= rounds {
        return done(Ok(u64_payload(rounds)));
    }
    let mut x = 0u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    std::hint::black_box(x);
    *finished += 1;
    StepOutput { status: Status::Continue, yields: vec![] }
}

fn flood(n: u64, completed: &mut u64, started: &mut bool, events: Vec<Event>) -> StepOutput {
    *completed += events.iter().filter(|event| matches!(event, Event::Completion(_))).count() as u64;
    if !*started {
        *started = true;
        return StepOutput { status: Status::Blocked, yields: (0..n).map(|tag| sleep(tag, 0)).collect() };
    }
    if *completed >= n {
        return done(Ok(u64_payload(n)));
    }
    StepOutput { status: Status::Blocked, yields: vec![] }
}

fn collect(n: u64, received: &mut u64, completed: &mut u64, sum: &mut u64, events: Vec<Event>) -> StepOutput {
    let mut yields = Vec::new();
    for event in events {
        match event {
            Event::Message(message) => {
                let Ok(bytes) = <[u8; 8]>::try_from(message.body.data.as_slice()) else {
                    return done(Err(format!("expected a counter of 8 bytes, got {}", message.body.data.len())));
                };
                let count = u64::from_le_bytes(bytes);
                *sum += count;
                yields.push(sleep(*received, count));
                *received += 1;
            }
            Event::Completion(_) => *completed += 1,
            _ => {}
        }
    }
    if *received >= n && *completed >= n {
        return done(Ok(u64_payload(*sum)));
    }
    let status = if *completed < *received { Status::Blocked } else { Status::Idle };
    StepOutput { status, yields }
}

export!(Waiter);
