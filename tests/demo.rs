//! The demo the README runs (`cargo run --release -p wasmproc-tests --example demo`):
//! every example guest, built from source by this crate's build script for
//! `wasm32-wasip2`, loaded as a component and run as processes on one scheduler. Here,
//! not in the example, so that a test runs it too (`tests/all/examples.rs`).

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use wasmproc::handler::Request;
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Config, Runtime};
use wasmproc::{Capabilities, Payload, Scheduler};

/// Runs the demo on a runtime made with `config`, writing what it does to `out`.
///
/// # Errors
///
/// A guest that does not load, a scheduler that does not start, or `out` failing. A
/// process's failure is one of the results shown, not an error.
pub fn run(config: Config, out: &mut dyn Write) -> anyhow::Result<()> {
    let runtime = Runtime::new(config)?;
    let guests = [
        ("hello", env!("GUEST_HELLO")),
        ("timers", env!("GUEST_TIMERS")),
        ("fan-out", env!("GUEST_FAN_OUT")),
        ("ping-pong", env!("GUEST_PING_PONG")),
        ("workflow", env!("GUEST_WORKFLOW")),
    ];
    // The workflow's inventory fails its first call, to show the guest's retry.
    let calls = AtomicUsize::new(0);
    let mut builder = Scheduler::builder().capabilities(Capabilities::default().allow("inventory.reserve")).handler(
        "inventory.reserve",
        move |request: Request<'_>| {
            if calls.fetch_add(1, Ordering::Relaxed) == 0 {
                request.complete(Err("inventory service unavailable".to_owned()));
            } else {
                request.complete(Payload::json(&"R-1001").map_err(|e| e.to_string()));
            }
        },
    );
    for (kind, path) in guests {
        let start = Instant::now();
        let component = runtime.load(path)?;
        writeln!(out, "loaded {kind:<9} in {:>8.1?}: entries {}", start.elapsed(), component.entries().join(", "))?;
        builder = builder.kind(kind, component);
    }
    let loads = runtime.stats();
    writeln!(
        out,
        "compiled {}, from the disk cache {} (run again: all from the cache)\n",
        loads.compiled, loads.disk_hits
    )?;
    let scheduler = builder.build()?;

    let runs: [(&str, &str, serde_json::Value); 7] = [
        ("hello", "greet", "wasmproc".into()),
        ("hello", "add", serde_json::json!([2, 40])),
        ("timers", "main", serde_json::json!([30, 10, 20])),
        ("fan-out", "main", 1000.into()),
        ("ping-pong", "main", 10_000.into()),
        ("workflow", "main", serde_json::json!({"item": "widget", "quantity": 3})),
        ("hello", "shout", serde_json::Value::Null),
    ];
    for (kind, method, input) in runs {
        let start = Instant::now();
        let shown = input.to_string();
        let outcome = scheduler
            .handle()
            .spawn(Spawnable::kind(kind), SpawnOptions::new(method).input(vec![Payload::json(&input)?]))
            .map(|p| p.join());
        let elapsed = start.elapsed();
        let shown_result = match outcome {
            Ok(Ok(payload)) => format!("ok {}", abbreviate(payload.as_str().unwrap_or("<bytes>"))),
            Ok(Err(error)) => format!("process failed: {error}"),
            Err(error) => format!("spawn refused: {error}"),
        };
        writeln!(out, "{kind}.{method}({}) → {shown_result}  [{elapsed:.1?}]", abbreviate(&shown))?;
    }

    let stats = scheduler.handle().stats();
    writeln!(
        out,
        "\n{} processes, {} steps, {} yields, {} messages; peak {} alive at once",
        stats.spawned,
        stats.workers.iter().map(|w| w.executed).sum::<u64>(),
        stats.yields,
        stats.messages,
        stats.peak_live
    )?;
    let report = scheduler.stop(Duration::from_secs(1));
    writeln!(out, "stopped in {:.1?}", report.elapsed)?;
    Ok(())
}

/// Long results (fan-out's 1000 squares) shortened to their ends.
fn abbreviate(text: &str) -> String {
    if text.len() <= 80 { text.to_owned() } else { format!("{} … {}", &text[..40], &text[text.len() - 30..]) }
}
