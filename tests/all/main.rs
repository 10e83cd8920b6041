//! Integration tests of the wasmproc host, in one binary.

/// The benchmarks' guest: each entry once, with the result the benches rely on.
mod bench_guest;
/// WASI programs as processes: load checks, exits from start functions, time limits.
mod commands;
/// Custom commands: unknown commands, handler errors, permissions (DESIGN 11).
mod dispatch;
/// The SDK-written example guests end to end: results, concurrency, retries, cancellation.
mod examples;
/// Exit reasons as data: what monitors and the embedder get for each way a process ends.
mod exits;
/// Whole-instance hibernation: guests stepped with and without it give the same outputs.
mod hibernation;
/// The `http` provider against a real server on loopback: allow-list, redirects, limits.
mod http;
/// Durable processes: the journal's records, write-ahead effects, a failing store.
mod journal;
/// Kinds a `KindSource` resolves on demand, in the spawner's scope and on resume.
mod kinds;
/// The `kv` provider: persistence, quotas, compare-and-swap under concurrency.
mod kv;
/// Guests in Python and JavaScript end to end; the instance limits they need.
mod languages;
/// The scheduler's import graph: its one circle is the one its module docs name.
mod layout;
/// Init, step statuses, step counts, errors, close (DESIGN 1, 2, 4, 12).
mod lifecycle;
/// Process limits and shutdown (DESIGN 13, 14).
mod limits;
/// Links and exit signals: propagation, trapping, kill, noproc, ordering, `max_links`.
mod links;
/// Send, mailboxes, terminate, monitors (DESIGN 9, 10).
mod messages;
/// Providers fs, env, time and random; families; commands served by a process.
mod providers;
/// Queue order and fairness: global FIFO, `Continue`, turn budgets.
mod queues;
/// Recovery at commit points a group commit rarely separates.
mod recovery;
/// The hostile guests: each limit ends only the process that passes it.
mod sandbox;
/// The guest SDK with real guests: commands past the per-step limit, cancellation, typed
/// errors and spawning, timeouts, parents, `select_any`, the `log` backend.
mod sdk;
/// Snapshots in the journal: recovery from one, the bound they keep, refusal of another's.
mod snapshots;
/// Thousands of processes mixing every kind of yield and message (DESIGN 6, 12).
mod stress;
/// The built-in supervisor: OTP's supervisor test cases on native children.
mod supervisor;
/// Suspension: durable processes out of memory while they wait, brought back from their
/// journal by their next event.
mod suspension;
/// `wait`: a step ended inside the guest's call of `step` keeps every rule of a step.
mod waiting;
/// Completion order and the wakeup protocol end to end (DESIGN 3, 5, 6, 7, 8).
mod wakeups;
/// Wasm processes end to end with the raw guest: loading, caches, world checks, traps, limits.
mod wasm;
/// The guest SDK's copy of the WIT is the host's.
mod wit;
