//! The benchmarks' guest (`tests/benches/all/wasm.rs`), written directly against `wit/` like
//! `raw`: no SDK, no executor, no serialisation, so what a benchmark measures is the
//! host's cost per process, step and message, not the guest's.
//!
//! Entries; numbers are `u64`s as 8 little-endian bytes (format `bytes`):
//! - `echo`: completes at once with its first input payload (an empty one without input);
//! - `cycles [n]`: each step yields one custom command `now` (the embedder registers it,
//!   and completes it at once) until `n` completions came back; then completes with `n`;
//! - `ping-pong [limit] [peer]?`: passes a counter back and forth with another process,
//!   through the host's `send` function (one step a message). The process given a peer
//!   starts by sending it 0. A process receiving `c` completes with `c` if `c >= limit`,
//!   else sends `c + 1` back to the sender; the process that sent `limit` completes with
//!   it once that send is made, so both end;
//! - `idle`: waits (status `idle`) for the first message, then completes with its body.
//! - `tree [leaves] [width]`: a tree of processes of this kind. A node with more than one
//!   leaf spawns up to `width` children (monitored), splitting its leaves between them as
//!   evenly as it can, and completes with the sum of their results once all have ended;
//!   a leaf completes with 1 at once. So the root completes with `leaves`.
//!
//! A `cancel` event ends any of them at once with the reason as the error.

use std::cell::RefCell;

// The world's `use` brings `Payload`, `Event` and `StepOutput` into this module.
use wasmproc::process::types::{Command, CustomCommand, ExitReason, SpawnRequest, Status, YieldCommand};

wit_bindgen::generate!({
    world: "process",
    path: "../../wit",
});

const ENTRIES: [&str; 5] = ["echo", "cycles", "ping-pong", "idle", "tree"];

// A guest instance runs exactly one process, so its state is a global. Wasm is
// single-threaded: the `RefCell` is only ever borrowed by the one export running now.
thread_local! {
    static PROCESS: RefCell<Option<Process>> = const { RefCell::new(None) };
}

enum Process {
    Echo(Option<Payload>),
    Cycles { n: u64, done: u64 },
    PingPong { limit: u64, peer: Option<u64>, started: bool },
    Idle,
    Tree { leaves: u64, width: u64, sum: u64, children: u64, ended: u64 },
}

struct Bench;

impl Guest for Bench {
    fn entries() -> Vec<String> {
        ENTRIES.iter().map(|e| e.to_string()).collect()
    }

    fn init(_pid: u64, method: String, input: Vec<Payload>) -> Result<(), String> {
        let process = match method.as_str() {
            "echo" => Process::Echo(input.into_iter().next()),
            "cycles" => Process::Cycles { n: number(&input, 0, "cycles", "n")?, done: 0 },
            "ping-pong" => Process::PingPong {
                limit: number(&input, 0, "ping-pong", "limit")?,
                peer: if input.len() > 1 { Some(number(&input, 1, "ping-pong", "peer")?) } else { None },
                started: false,
            },
            "idle" => Process::Idle,
            "tree" => {
                let leaves = number(&input, 0, "tree", "leaves")?;
                let width = number(&input, 1, "tree", "width")?;
                if width < 2 {
                    return Err(format!("`tree` needs a `width` of at least 2, got {width}"));
                }
                Process::Tree { leaves, width, sum: 0, children: 0, ended: 0 }
            }
            // The host adds the list of entries.
            other => return Err(format!("unknown entry method `{other}`")),
        };
        PROCESS.with(|p| *p.borrow_mut() = Some(process));
        Ok(())
    }

    fn step(events: Vec<Event>) -> StepOutput {
        if let Some(reason) = events.iter().find_map(|e| if let Event::Cancel(r) = e { Some(r) } else { None }) {
            return done(Err(format!("cancelled: {reason}")));
        }
        PROCESS.with(|p| {
            let mut guard = p.borrow_mut();
            match guard.as_mut().expect("the host calls `init` before `step`") {
                Process::Echo(first) => {
                    done(Ok(first.take().unwrap_or_else(|| Payload { format: "bytes".to_string(), data: vec![] })))
                }
                Process::Cycles { n, done: completed } => cycles(*n, completed, events),
                Process::PingPong { limit, peer, started } => ping_pong(*limit, peer, started, events),
                Process::Idle => idle(events),
                Process::Tree { leaves, width, sum, children, ended } => {
                    tree(*leaves, *width, sum, children, ended, events)
                }
            }
        })
    }
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
        if let Err(e) = wasmproc::process::host::send(to, "", &u64_payload(count)) {
            return done(Err(format!("send of {count} failed: {e}")));
        }
        if count >= limit {
            return done(Ok(u64_payload(count)));
        }
    }
    StepOutput { status: Status::Idle, yields: vec![] }
}

fn idle(events: Vec<Event>) -> StepOutput {
    for event in events {
        if let Event::Message(message) = event {
            return done(Ok(message.body));
        }
    }
    StepOutput { status: Status::Idle, yields: vec![] }
}

/// The first step spawns the children; later steps count their exits. `children` is 0
/// until then, so a node is never complete before it has spawned.
fn tree(leaves: u64, width: u64, sum: &mut u64, children: &mut u64, ended: &mut u64, events: Vec<Event>) -> StepOutput {
    if leaves <= 1 {
        return done(Ok(u64_payload(leaves)));
    }
    for event in events {
        match event {
            Event::Exit(exit) => match exit.reason {
                ExitReason::Normal(payload) => {
                    let Ok(bytes) = <[u8; 8]>::try_from(payload.data.as_slice()) else {
                        return done(Err(format!("child {} returned {} bytes, not a count", exit.pid, payload.data.len())));
                    };
                    *sum += u64::from_le_bytes(bytes);
                    *ended += 1;
                }
                other => return done(Err(format!("child {} ended abnormally: {other:?}", exit.pid))),
            },
            Event::Completion(completion) => {
                if let Err(e) = completion.result {
                    return done(Err(format!("spawn {} failed: {e}", completion.tag)));
                }
            }
            _ => {}
        }
    }
    if *children == 0 {
        let count = width.min(leaves);
        let yields = (0..count)
            .map(|i| {
                // The first `leaves % count` children take one leaf more than the rest.
                let share = leaves / count + u64::from(i < leaves % count);
                let spawn = SpawnRequest {
                    kind: None,
                    method: "tree".to_string(),
                    input: vec![u64_payload(share), u64_payload(width)],
                    monitor: true,
                    link: false,
                };
                YieldCommand { tag: i, command: Command::Spawn(spawn) }
            })
            .collect();
        *children = count;
        return StepOutput { status: Status::Idle, yields };
    }
    if *ended == *children {
        return done(Ok(u64_payload(*sum)));
    }
    StepOutput { status: Status::Idle, yields: vec![] }
}

export!(Bench);
