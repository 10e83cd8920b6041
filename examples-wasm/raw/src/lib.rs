//! A wasmproc guest written directly against `wit/`, with no SDK: the smallest complete
//! example of the contract, and the host's end-to-end test subject.
//!
//! Entries:
//! - `main`: yields one `sleep` of 1 ms, then completes with the number of input payloads
//!   as JSON;
//! - `echo`: completes at once with its first input payload. Without input it panics,
//!   which is a trap: the tests use it to check that a trap ends only its own process.
//!
//! `main` logs through the host's `log` import and `echo` prints to stdout, so both ways
//! a guest reaches the host log are exercised.

use std::cell::RefCell;

use wasmproc::process::host::{Level, log};
// The world's `use` brings `Payload`, `Event` and `StepOutput` into this module.
use wasmproc::process::types::{Command, Status, YieldCommand};

wit_bindgen::generate!({
    world: "process",
    path: "../../wit",
});

const ENTRIES: [&str; 2] = ["main", "echo"];

/// The tag of `main`'s one sleep.
const SLEEP_TAG: u64 = 1;

// A guest instance runs exactly one process, so its state is a global. Wasm is
// single-threaded: the `RefCell` is only ever borrowed by the one export running now.
thread_local! {
    static PROCESS: RefCell<Option<Process>> = const { RefCell::new(None) };
}

struct Process {
    method: Method,
    input: Vec<Payload>,
    slept: bool,
}

#[derive(Clone, Copy)]
enum Method {
    Main,
    Echo,
}

struct Raw;

impl Guest for Raw {
    fn entries() -> Vec<String> {
        ENTRIES.iter().map(|e| e.to_string()).collect()
    }

    fn init(pid: u64, method: String, input: Vec<Payload>) -> Result<(), String> {
        let method = match method.as_str() {
            "main" => Method::Main,
            "echo" => Method::Echo,
            // The host adds the list of entries.
            other => return Err(format!("unknown entry method `{other}`")),
        };
        if let Method::Main = method {
            log(Level::Info, &format!("process {pid} starts `main` with {} inputs", input.len()));
        }
        PROCESS.with(|p| *p.borrow_mut() = Some(Process { method, input, slept: false }));
        Ok(())
    }

    fn step(events: Vec<Event>) -> StepOutput {
        PROCESS.with(|p| {
            let mut guard = p.borrow_mut();
            let process = guard.as_mut().expect("the host calls `init` before `step`");
            match process.method {
                Method::Main => main(process, &events),
                Method::Echo => echo(process),
            }
        })
    }
}

fn main(process: &mut Process, events: &[Event]) -> StepOutput {
    if !process.slept {
        process.slept = true;
        let sleep = YieldCommand { tag: SLEEP_TAG, command: Command::Sleep(1_000_000) };
        return StepOutput { status: Status::Blocked, yields: vec![sleep] };
    }
    let woke = events.iter().any(|e| matches!(e, Event::Completion(c) if c.tag == SLEEP_TAG));
    if !woke {
        return StepOutput { status: Status::Blocked, yields: vec![] };
    }
    let count = process.input.len().to_string().into_bytes();
    let result = Payload { format: "json".to_string(), data: count };
    StepOutput { status: Status::Complete(Ok(result)), yields: vec![] }
}

fn echo(process: &mut Process) -> StepOutput {
    // Indexing, not `first()`: an empty input is meant to trap (see the crate docs).
    let first = process.input.swap_remove(0);
    println!("echo: {} bytes of `{}`", first.data.len(), first.format);
    StepOutput { status: Status::Complete(Ok(first)), yields: vec![] }
}

export!(Raw);
