//! Hostile guests for the sandbox tests: each entry misbehaves in one way, and the host
//! must end only that process, with an error naming what it did. Not a demo: nothing
//! here is how to write a guest.
//!
//! Written against `wit/` directly (no SDK), so `init` can misbehave too; the `handler`
//! world, so that it can misbehave as a provider too.
//!
//! | entry | what it does |
//! |---|---|
//! | `spin` | loops forever in `step` |
//! | `memory-bomb` | allocates 1 MiB at a time until something stops it |
//! | `stack-overflow` | recurses with a large frame until the stack runs out |
//! | `deep-recursion` | recurses with a small frame, millions deep |
//! | `panic` | panics in `step` |
//! | `trap-in-init` | traps in `init` (unreachable) |
//! | `send-in-init` | calls the host's `send` in `init`, and refuses to start with the error it got |
//! | `yield-flood` | yields 100,000 sleeps in one step |
//! | `flood-and-complete` | yields 100,000 sleeps in the step that completes (with `100000`): not hostile, the yields are discarded |
//! | `message-flood` | sends its first input's pid 10,000 messages, one step after another |
//! | `giant-payload` | completes with a 32 MiB result |
//! | `giant-send` | hands the host's `send` a 32 MiB message for its parent |
//! | `giant-respond` | answers a request with a 32 MiB payload, and fails with what `respond` said |
//! | `mailbox-hoard` | sends its first input's pid up to 32 messages of 8 MiB in one step, and completes with how many were taken and why the next was not |
//! | `output-hoard` | yields 8 custom commands of 12 MiB each in one step (run it with 128 MiB of memory), then completes with `8` |
//! | `spawn-bomb` | spawns two more of itself, forever |
//! | `fuel-burn` | loops for about 10^9 instructions, then completes (for fuel budgets) |
//! | `orphan` | spawns a `spin` child and completes at once, leaving the child running |
//! | `busy` | not hostile, only slow: computes for its input's milliseconds in its first step, then completes with the first message it gets (for preemption) |
//! | `probe` | for hibernation: at each message grows its memory by a page and fills it, checks every page it filled before, calls through its table of functions and notes where its stack is; at the message `stop` completes with what it saw at each step |

use std::cell::RefCell;
use std::hint::black_box;

use wasmproc::process::types::{Command, CustomCommand, SendRequest, SpawnRequest, Status, YieldCommand};

wit_bindgen::generate!({
    world: "handler",
    path: "../../wit",
});

const ENTRIES: [&str; 20] = [
    "spin",
    "memory-bomb",
    "stack-overflow",
    "deep-recursion",
    "panic",
    "trap-in-init",
    "send-in-init",
    "yield-flood",
    "flood-and-complete",
    "message-flood",
    "giant-payload",
    "giant-send",
    "giant-respond",
    "mailbox-hoard",
    "output-hoard",
    "spawn-bomb",
    "fuel-burn",
    "orphan",
    "busy",
    "probe",
];

// One process per instance, and Wasm is single-threaded: see `examples-wasm/raw`.
thread_local! {
    static PROCESS: RefCell<Option<(String, Vec<Payload>, u64)>> = const { RefCell::new(None) };
    static HOARD: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    /// `probe`: the pages it grew, and a line for each step.
    static PROBE: RefCell<(Vec<(usize, u64)>, Vec<String>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

struct Hostile;

impl Guest for Hostile {
    fn entries() -> Vec<String> {
        ENTRIES.iter().map(|e| e.to_string()).collect()
    }

    fn init(_pid: u64, method: String, input: Vec<Payload>) -> Result<(), String> {
        if !ENTRIES.contains(&method.as_str()) {
            return Err(format!("unknown entry method `{method}`"));
        }
        if method == "trap-in-init" {
            core::arch::wasm32::unreachable();
        }
        if method == "send-in-init" {
            let body = Payload { format: "bytes".into(), data: vec![] };
            return match wasmproc::process::host::send(0, "early", &body) {
                Ok(()) => Err("the host accepted a send during init".to_owned()),
                Err(e) => Err(format!("send in init: {e}")),
            };
        }
        PROCESS.with(|p| *p.borrow_mut() = Some((method, input, 0)));
        Ok(())
    }

    fn step(events: Vec<Event>) -> StepOutput {
        let (method, input, steps) = PROCESS.with(|p| {
            let mut p = p.borrow_mut();
            let (method, input, steps) = p.as_mut().expect("init runs first");
            *steps += 1;
            (method.clone(), input.clone(), *steps)
        });
        match method.as_str() {
            "spin" => loop {
                black_box(steps);
            },
            "memory-bomb" => loop {
                HOARD.with(|h| h.borrow_mut().push(vec![1u8; 1 << 20]));
            },
            "stack-overflow" => complete(big_frames(black_box(u64::MAX))),
            "deep-recursion" => complete(small_frames(black_box(10_000_000))),
            "panic" => panic!("the hostile guest panics on purpose"),
            "yield-flood" => {
                let yields = (0..100_000).map(|tag| YieldCommand { tag, command: Command::Sleep(1) }).collect();
                StepOutput { status: Status::Blocked, yields }
            }
            "flood-and-complete" => {
                let yields = (0..100_000).map(|tag| YieldCommand { tag, command: Command::Sleep(1) }).collect();
                StepOutput { yields, ..complete(100_000) }
            }
            "message-flood" => {
                let to = input.first().and_then(|p| std::str::from_utf8(&p.data).ok()?.parse().ok()).unwrap_or(0);
                let body = Payload { format: "text".into(), data: b"flood".to_vec() };
                let send = Command::Send(SendRequest { to, topic: "flood".into(), body });
                if steps > 10_000 {
                    return complete(steps);
                }
                StepOutput { status: Status::Continue, yields: vec![YieldCommand { tag: steps, command: send }] }
            }
            "giant-payload" => {
                let data = vec![7u8; 32 << 20];
                StepOutput { status: Status::Complete(Ok(Payload { format: "bytes".into(), data })), yields: vec![] }
            }
            "giant-send" => {
                let body = Payload { format: "bytes".into(), data: vec![7u8; 32 << 20] };
                let parent = wasmproc::process::host::parent().unwrap_or(0);
                match wasmproc::process::host::send(parent, "t", &body) {
                    Ok(()) => complete(1),
                    Err(_) => complete(0),
                }
            }
            "giant-respond" => {
                let answer = Payload { format: "bytes".into(), data: vec![7u8; 32 << 20] };
                match wasmproc::process::provider::respond(1, Ok(&answer)) {
                    Ok(()) => complete(1),
                    Err(refused) => StepOutput { status: Status::Complete(Err(refused)), yields: vec![] },
                }
            }
            "mailbox-hoard" => {
                let to = input.first().and_then(|p| std::str::from_utf8(&p.data).ok()?.parse().ok()).unwrap_or(0);
                let body = Payload { format: "bytes".into(), data: vec![7u8; 8 << 20] };
                let mut taken = 0;
                let mut refused = String::from("none");
                for _ in 0..32 {
                    match wasmproc::process::host::send(to, "hoard", &body) {
                        Ok(()) => taken += 1,
                        Err(error) => {
                            refused = error;
                            break;
                        }
                    }
                }
                let data = format!("{taken} taken; refused: {refused}").into_bytes();
                StepOutput { status: Status::Complete(Ok(Payload { format: "text".into(), data })), yields: vec![] }
            }
            "output-hoard" if steps == 1 => {
                let hoard = |tag| YieldCommand {
                    tag,
                    command: Command::Custom(CustomCommand {
                        name: "hoard".into(),
                        payload: Payload { format: "bytes".into(), data: vec![7u8; 12 << 20] },
                    }),
                };
                StepOutput { status: Status::Blocked, yields: (0..8).map(hoard).collect() }
            }
            "output-hoard" => complete(8),
            "spawn-bomb" => {
                let spawn = |tag| YieldCommand {
                    tag,
                    command: Command::Spawn(SpawnRequest {
                        kind: None,
                        method: "spawn-bomb".into(),
                        input: vec![],
                        monitor: false,
                        link: false,
                    }),
                };
                StepOutput { status: Status::Idle, yields: if steps == 1 { vec![spawn(1), spawn(2)] } else { vec![] } }
            }
            "fuel-burn" => {
                let mut x = 0u64;
                for i in 0..black_box(300_000_000u64) {
                    x = black_box(x.wrapping_add(i));
                }
                complete(x)
            }
            "orphan" if steps == 1 => {
                let spawn = Command::Spawn(SpawnRequest {
                    kind: None,
                    method: "spin".into(),
                    input: vec![],
                    monitor: false,
                    link: false,
                });
                StepOutput { status: Status::Blocked, yields: vec![YieldCommand { tag: 1, command: spawn }] }
            }
            "orphan" => StepOutput {
                status: Status::Complete(Ok(Payload { format: "json".into(), data: b"\"orphaned\"".to_vec() })),
                yields: vec![],
            },
            "busy" if steps == 1 => {
                let millis = input.first().and_then(|p| std::str::from_utf8(&p.data).ok()?.parse().ok()).unwrap_or(0);
                let until = std::time::Instant::now() + std::time::Duration::from_millis(millis);
                while std::time::Instant::now() < until {
                    black_box(steps);
                }
                StepOutput { status: Status::Idle, yields: vec![] }
            }
            "busy" => match events.into_iter().find_map(|e| if let Event::Message(m) = e { Some(m) } else { None }) {
                Some(message) => StepOutput { status: Status::Complete(Ok(message.body)), yields: vec![] },
                None => StepOutput { status: Status::Idle, yields: vec![] },
            },
            "probe" => {
                for event in events {
                    let Event::Message(message) = event else { continue };
                    if message.topic == "stop" {
                        let seen = PROBE.with(|p| p.borrow().1.join("\n"));
                        let result = Payload { format: "bytes".into(), data: seen.into_bytes() };
                        return StepOutput { status: Status::Complete(Ok(result)), yields: vec![] };
                    }
                    probe(&message.body.data);
                }
                StepOutput { status: Status::Idle, yields: vec![] }
            }
            other => unreachable!("init accepted `{other}`"),
        }
    }
}

/// One message of `probe`: what a restore that missed anything would change.
fn probe(body: &[u8]) {
    const PAGE: usize = 65536;
    let fill = |page: usize, step: u64| (step as u8).wrapping_mul(31) ^ (page as u8);
    // A new last page, filled through and through.
    let grown = core::arch::wasm32::memory_grow(0, 1);
    PROBE.with(|p| {
        let (pages, lines) = &mut *p.borrow_mut();
        let steps = lines.len() as u64 + 1;
        if grown != usize::MAX {
            // SAFETY: the page was just grown, and nothing else (the allocator included)
            // uses memory it did not grow itself.
            unsafe { std::ptr::write_bytes((grown * PAGE) as *mut u8, fill(grown, steps), PAGE) };
            pages.push((grown, steps));
        }
        // Every page grown before still holds what its step wrote.
        let mut intact = 0;
        for &(page, step) in pages.iter() {
            // SAFETY: a page this process grew; it owns it.
            let bytes = unsafe { std::slice::from_raw_parts((page * PAGE) as *const u8, PAGE) };
            intact += bytes.iter().all(|&b| b == fill(page, step)) as usize;
        }
        // The table: a call through a function pointer the step picks.
        let table: [fn(u64) -> u64; 3] = [|n| n + 1, |n| n * 3, |n| n ^ 0x5555];
        let called = black_box(table)[steps as usize % 3](steps);
        // The stack pointer, a global: where a local lives.
        let local = black_box(0u8);
        let stack = black_box(&local) as *const u8 as usize;
        let heap: Vec<u8> = body.to_vec();
        lines.push(format!(
            "message {steps}: {} pages, {} grown, {intact} intact, called {called}, stack at {stack}, body {:?}",
            core::arch::wasm32::memory_size(0),
            pages.len(),
            String::from_utf8_lossy(&heap),
        ));
    });
}

fn complete(n: u64) -> StepOutput {
    let result = Payload { format: "json".into(), data: n.to_string().into_bytes() };
    StepOutput { status: Status::Complete(Ok(result)), yields: vec![] }
}

/// Recursion with a 64 KiB frame: runs out of the 64 KiB shadow stack at once, and of
/// the native stack soon after.
#[inline(never)]
fn big_frames(n: u64) -> u64 {
    let frame = black_box([n as u8; 64 * 1024]);
    if n == 0 {
        frame[0] as u64
    } else {
        big_frames(black_box(n - 1)).wrapping_add(frame[n as usize % frame.len()] as u64)
    }
}

/// Recursion with a tiny frame, `n` deep: exhausts the native stack (wasmtime's
/// `max_wasm_stack`) without touching linear memory.
#[inline(never)]
fn small_frames(n: u64) -> u64 {
    if n == 0 { 0 } else { small_frames(black_box(n - 1)).wrapping_add(black_box(1)) }
}

export!(Hostile);
