//! Allocations on the host's hot paths, counted by a global allocator that counts every
//! allocation on every thread, and the bytes asked for: this binary runs one test at a
//! time (`main` below calls them in turn), so while a workload runs only the scheduler's
//! threads allocate.
//!
//! Each workload runs at two sizes on one warm scheduler, and the difference is divided
//! by the difference in size: what the workload costs a unit (a yield cycle, a message,
//! a step), with everything paid once (spawning, growing a buffer to its working size)
//! cancelled out. The bytes held are counted too (allocated less freed), for what an idle
//! process keeps.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use wasmproc::handler::Request;
use wasmproc::journal::{Journal, MemoryStore};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Config, Runtime};
use wasmproc::{Capabilities, Event, Events, Payload, Pid, Port, Process, Scheduler, Status, StepOutput};
use wasmproc_tests::{HANG, Scripted, Yielder, gate, guests};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed.
static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is `System`'s; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Allocations a unit of `run`: `run(n)` at two sizes, the difference over the sizes'.
fn per_unit(small: u64, large: u64, run: impl Fn(u64)) -> f64 {
    run(small); // warms everything up: the scheduler's buffers reach their working sizes
    let count = |n| {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        run(n);
        ALLOCATIONS.load(Ordering::Relaxed) - before
    };
    let (a, b) = (count(small), count(large));
    (b as f64 - a as f64) / (large - small) as f64
}

/// Passes an empty message back and forth with its peer through its port until it has
/// had `limit`, answering each; the client (whose input names the server) sends first.
struct PingPong {
    port: Option<Port>,
    peer: Option<Pid>,
    got: u64,
    limit: u64,
}

impl Process for PingPong {
    fn init(&mut self, port: Port, _: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        self.peer = input.first().and_then(Payload::to_u64).map(Pid::from_u64);
        self.port = Some(port);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let port = self.port.as_ref().expect("init ran");
        let mut reply = self.peer.is_some() && self.got == 0;
        for event in events {
            if let Event::Message { sender, .. } = event {
                self.peer = Some(sender);
                self.got += 1;
                reply = true;
            }
        }
        if reply && let Some(peer) = self.peer {
            // The client's last message is answered after it has ended.
            let _ = port.send(peer, String::new(), Payload::empty());
        }
        if self.got >= self.limit {
            out.complete(Ok(Payload::empty()));
            return Ok(());
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

fn native_scheduler() -> Scheduler {
    Scheduler::builder()
        .workers(1)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .build()
        .expect("the scheduler starts")
}

/// A yield cycle (step, custom command, its completion, the next step) allocates nothing.
fn a_yield_cycle_allocates_nothing() {
    let s = native_scheduler();
    let per_cycle = per_unit(1_000, 21_000, |n| {
        let process = s.handle().spawn(Yielder { left: n }, "main").unwrap();
        assert_eq!(process.join_timeout(HANG), Some(Ok(Payload::empty())));
    });
    assert!(per_cycle < 0.01, "{per_cycle} allocations a yield cycle");
}

/// A message sent through a port, delivered and stepped on, allocates nothing but what
/// its payload holds (here nothing: an empty body and topic).
fn a_message_allocates_nothing_beyond_its_payload() {
    let s = native_scheduler();
    let per_message = per_unit(1_000, 21_000, |n| {
        let pair = |peer: Option<Pid>| PingPong { port: None, peer, got: 0, limit: n };
        let server = s.handle().spawn(pair(None), "serve").unwrap();
        let input = vec![Payload::u64(server.pid().as_u64())];
        let client = s.handle().spawn(pair(Some(server.pid())), SpawnOptions::new("client").input(input)).unwrap();
        assert_eq!(client.join_timeout(HANG), Some(Ok(Payload::empty())));
        assert_eq!(server.join_timeout(HANG), Some(Ok(Payload::empty())));
    });
    assert!(per_message < 0.01, "{per_message} allocations a message");
}

fn wasm_scheduler() -> Scheduler {
    wasm_scheduler_with(None)
}

/// The bench guest's scheduler, durable on `journal` if given; `now` has an effect, so a
/// durable step's yield is carried out by the committing thread.
fn wasm_scheduler_with(journal: Option<Journal>) -> Scheduler {
    let runtime = Runtime::new(Config::default().no_disk_cache()).expect("the runtime starts");
    let guest = runtime.load(guests::BENCH).expect("the bench guest loads");
    let mut builder = Scheduler::builder()
        .workers(1)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .kind("bench", guest);
    if let Some(journal) = journal {
        builder = builder.journal(journal);
    }
    builder.build().expect("the scheduler starts")
}

/// A Wasm step that yields a custom command and is woken by its completion allocates
/// three times: the list of yields and the command's name (lifted by wasmtime's typed
/// lift; `Command::Custom` owns its name) and wasmtime's fiber for the call. Pinned to
/// that count, so that an allocation added to the path fails here.
fn a_wasm_step_allocates_only_what_its_output_needs() {
    let per_step = allocations_a_cycle_step(&wasm_scheduler());
    assert!(per_step < 3.05, "{per_step} allocations a step");
}

/// Allocations a step of the bench guest's `cycles` on `s`: each step yields `now` and
/// is woken by its completion.
fn allocations_a_cycle_step(s: &Scheduler) -> f64 {
    per_unit(1_000, 11_000, |n| {
        let options = SpawnOptions::new("cycles").input(vec![Payload::u64(n)]);
        let process = s.handle().spawn(Spawnable::kind("bench"), options).unwrap();
        assert_eq!(process.join_timeout(HANG), Some(Ok(Payload::u64(n))));
    })
}

/// A durable step allocates three times more than a step in memory: its record's
/// encoded value, the store's copy of it (a `MemoryStore` here, whose tree nodes add a
/// fraction), and the copy of the events it was given, kept for the record. What it
/// yields reaches the committing thread without the worker's vector of yields, which
/// stays for the next step (with it handed over, 7.2 a step): a vector allocated on one
/// thread and freed on another takes both threads through glibc's arena lock
/// (docs/perf/durable.md, "A step's yields stay with its worker").
fn a_durable_step_allocates_its_record_not_its_worker_s_vectors() {
    let per_step = allocations_a_cycle_step(&wasm_scheduler_with(Some(Journal::with_store(MemoryStore::new()))));
    assert!(per_step < 6.5, "{per_step} allocations a durable step");
}

/// A Wasm message (the `send` host function and the step it wakes) allocates twice: its
/// body, and wasmtime's fiber for the receiver's step.
fn a_wasm_message_allocates_only_its_payload() {
    let per_message = allocations_a_ping_pong_message(&wasm_scheduler());
    assert!(per_message < 2.05, "{per_message} allocations a message");
}

/// Allocations a message of the bench guest's `ping-pong` on `s`: a server and a client
/// exchange `n` messages.
fn allocations_a_ping_pong_message(s: &Scheduler) -> f64 {
    per_unit(1_000, 11_000, |n| {
        let spawn = |input| s.handle().spawn(Spawnable::kind("bench"), SpawnOptions::new("ping-pong").input(input));
        let server = spawn(vec![Payload::u64(n)]).unwrap();
        let client = spawn(vec![Payload::u64(n), Payload::u64(server.pid().as_u64())]).unwrap();
        assert_eq!(server.join_timeout(HANG), Some(Ok(Payload::u64(n))));
        assert_eq!(client.join_timeout(HANG), Some(Ok(Payload::u64(n))));
    })
}

/// The same message to a guest that ends its steps in `wait` (`examples-wasm/waiter`)
/// allocates twice too, but no fiber: its body, and the box of `wait`'s future, which
/// wasmtime 48's asynchronous host functions return (`LinkerInstance::func_wrap_async`
/// takes a `Box<dyn Future>`). The receiver's step resumes its fiber, suspended in
/// `wait`, instead of making one for a new call, and the events' buffer goes back to
/// the thread for the next (`host/src/wasm/waiting.rs`).
fn a_wasm_message_through_wait_allocates_no_fiber() {
    let per_message = allocations_a_ping_pong_message(&waiter_scheduler());
    assert!(per_message < 2.05, "{per_message} allocations a message");
}

/// A step of `cycles` ended in `wait` allocates three times: what its output needs (the
/// list of yields and the command's name) and the box of `wait`'s future, in place of
/// the fiber.
fn a_wasm_step_through_wait_allocates_no_fiber() {
    let per_step = allocations_a_cycle_step(&waiter_scheduler());
    assert!(per_step < 3.05, "{per_step} allocations a step");
}

/// [`wasm_scheduler`] with the waiter guest as kind `bench`.
fn waiter_scheduler() -> Scheduler {
    let runtime = Runtime::new(Config::default().no_disk_cache()).expect("the runtime starts");
    let guest = runtime.load(guests::WAITER).expect("the waiter guest loads");
    Scheduler::builder()
        .workers(1)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .kind("bench", guest)
        .build()
        .expect("the scheduler starts")
}

/// A message over the payload limit given to `send` ends its process without being
/// copied into the host: the 32 MiB the hostile guest hands over never reach its heap
/// (its own linear memory is mapped by wasmtime, not allocated here).
fn a_giant_send_is_refused_before_it_is_copied() {
    refused_before_it_is_copied("giant-send", "payload limit exceeded: a 33554433-byte payload for `send`");
}

/// So is an answer over the limit that a provider gives `respond`.
fn a_giant_answer_is_refused_before_it_is_copied() {
    refused_before_it_is_copied("giant-respond", "payload limit exceeded: a 33554437-byte payload for `respond`");
}

/// Runs the hostile guest's `entry`, which hands the host 32 MiB over the payload limit:
/// it must fail saying `error`, and the host's heap must not have grown by the 32 MiB.
fn refused_before_it_is_copied(entry: &str, error: &str) {
    let runtime = Runtime::new(Config::default().no_disk_cache()).expect("the runtime starts");
    let guest = runtime.load(guests::HOSTILE).expect("the hostile guest loads");
    let s = Scheduler::builder().workers(1).kind("hostile", guest).build().expect("the scheduler starts");
    let before = BYTES.load(Ordering::Relaxed);
    let process = s.handle().spawn(Spawnable::kind("hostile"), entry).unwrap();
    let failed = wasmproc_tests::said(process.join_timeout(HANG).expect("it ends").expect_err("it fails"));
    let allocated = BYTES.load(Ordering::Relaxed) - before;
    assert!(failed.contains(error), "{failed}");
    assert!(allocated < 4 << 20, "{allocated} bytes allocated for a refused 32 MiB `{entry}`");
}

/// A mailbox holds at most `mailbox_bytes` (64 MiB by default) of undelivered messages,
/// whatever their count: the hostile guest's 8 MiB messages (and 5-byte topics) to a
/// process that is not reading (its step holds a worker at a gate) are refused past the
/// 7th, so the host holds 56 MiB for them, not the 256 MiB of the 32 it tries (without
/// the bound, 1,024 of 16 MiB: 16 GiB a mailbox).
fn a_mailbox_holds_its_bytes_not_more() {
    let runtime = Runtime::new(Config::default().no_disk_cache()).expect("the runtime starts");
    let guest = runtime.load(guests::HOSTILE).expect("the hostile guest loads");
    let s = Scheduler::builder().workers(2).kind("hostile", guest).build().expect("the scheduler starts");
    let (gate, stop) = gate();
    let (deaf, _) = Scripted::new(move |t| {
        if t.step == 0 {
            stop.wait();
        }
        t.out.complete(Ok(Payload::empty()));
        Ok(())
    });
    let deaf = s.handle().spawn(deaf, "main").unwrap();
    gate.wait_reached();
    let before = BYTES.load(Ordering::Relaxed);
    let input = vec![Payload::text(deaf.pid().as_u64().to_string())];
    let hoarder =
        s.handle().spawn(Spawnable::kind("hostile"), SpawnOptions::new("mailbox-hoard").input(input)).unwrap();
    let said = hoarder.join_timeout(HANG).expect("it ends").expect("it completes");
    let allocated = BYTES.load(Ordering::Relaxed) - before;
    gate.open();
    assert_eq!(deaf.join_timeout(HANG), Some(Ok(Payload::empty())));
    let said = said.as_str().expect("text").to_owned();
    assert!(said.starts_with("7 taken; refused: mailbox of process"), "{said}");
    assert!(said.contains("would pass 67108864 bytes") && said.contains("`mailbox_bytes`"), "{said}");
    // The 7 taken and the 8th, copied before it was refused.
    assert!(allocated < 72 << 20, "{allocated} bytes allocated for a mailbox of 64 MiB");
}

/// A step's output is bounded as a whole (`max_output_per_step`, by default four times
/// the payload limit: 64 MiB), not only each payload: the hostile guest's 8 commands of
/// 12 MiB (96 MiB, each within the limit) end it with an error naming the bound, and the
/// host copies none of the commands past it.
fn a_step_s_output_is_bounded_as_a_whole() {
    let runtime = Runtime::new(Config::default().max_memory(256 << 20).no_disk_cache()).expect("the runtime starts");
    let guest = runtime.load(guests::HOSTILE).expect("the hostile guest loads");
    let s = Scheduler::builder().workers(1).kind("hostile", guest).build().expect("the scheduler starts");
    let before = BYTES.load(Ordering::Relaxed);
    let process = s.handle().spawn(Spawnable::kind("hostile"), "output-hoard").unwrap();
    let failed = wasmproc_tests::said(process.join_timeout(HANG).expect("it ends").expect_err("it fails"));
    let allocated = BYTES.load(Ordering::Relaxed) - before;
    let expected = "step output limit exceeded: one step's commands and result carry 100663336 bytes, more than \
                    `max_output_per_step` (67108864 bytes)";
    assert!(failed.contains(expected), "{failed}");
    // The 5 commands within the bound.
    assert!(allocated < 64 << 20, "{allocated} bytes allocated for a refused 96 MiB output");
}

/// An idle process of an SDK guest (`examples-wasm/ping-pong`'s `pong`, waiting in
/// `ctx.recv()` after its first step, and hibernated with its instance kept) touches 8
/// pages of the runtime's arenas, all of them its linear memory's: the top of its shadow
/// stack, its data (24 KiB: 6 pages) and one page of heap, which the SDK's allocator
/// carves from pages of its own (`guest-sdk/src/alloc.rs`); with wasi-libc's `malloc` it
/// was 9, the heap's start and the end of the initial memory, where `malloc` marks the
/// end of its heap. Its fiber stack's pages were given back when it hibernated. On the
/// host's heap it holds about 19.2 KiB (pinned at 20 KiB), nearly all wasmtime's instance
/// (its 210 escaped functions cost 40 bytes each). Counted over 1,000 processes spawned
/// after 100 that warm up.
fn an_idle_sdk_process_touches_eight_pages() {
    let (pages, heap) = idle_sdk_processes(false);
    println!("an idle SDK process: {pages:.2} pages of the arenas, {heap:.0} bytes of the host's heap");
    assert!(pages <= 8.05, "{pages} pages of the arenas an idle SDK process");
    assert!(heap <= 20_480.0, "{heap} bytes of the host's heap an idle SDK process");
}

/// The same process hibernated whole gives its instance back: it keeps on the host's
/// heap only its pages that differ from its component's image, compressed, its globals
/// and its scheduler entry (about 3.9 KiB, pinned at 6 KiB), and no page of the arenas of
/// its own: its slot is free, zeroed, and kept resident only as one of the runtime's
/// bounded warm slots, for the next process.
fn an_idle_sdk_process_hibernated_whole_keeps_under_six_kib() {
    let (_, heap) = idle_sdk_processes(true);
    println!("an idle SDK process hibernated whole: {heap:.0} bytes of the host's heap");
    assert!(heap <= 6_144.0, "{heap} bytes of the host's heap an idle SDK process hibernated whole");
}

/// Pages of the arenas and bytes of the host's heap an idle SDK process holds once
/// hibernated (`whole`: its instance given back too), over 1,000 processes spawned after
/// 100 that warm up.
fn idle_sdk_processes(whole: bool) -> (f64, f64) {
    const WARM: usize = 100;
    const COUNTED: usize = 1_000;
    // Enough slots that the stack arena (a MiB a slot) is over a GiB: only the arenas'
    // mappings are that large.
    let config = Config::default().max_instances(2_048).no_disk_cache().hibernate_instances(whole);
    let runtime = Runtime::new(config).expect("the runtime starts");
    let guest = runtime.load(env!("GUEST_PING_PONG")).expect("the ping-pong guest loads");
    let s = Scheduler::builder().workers(1).kind("ping-pong", guest).build().expect("the scheduler starts");
    let mut handles = Vec::new();
    let mut spawn_idle = |count: usize| {
        for _ in 0..count {
            handles.push(s.handle().spawn(Spawnable::kind("ping-pong"), "pong").expect("an idle process starts"));
        }
        // Each waits in `ctx.recv()` after its first step, and hibernates once the
        // worker has nothing else to run.
        let hibernated = || {
            if whole { runtime.hibernation_stats().hibernated } else { s.handle().stats().hibernated }
        };
        let deadline = std::time::Instant::now() + HANG;
        while hibernated() < handles.len() as u64 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(hibernated(), handles.len() as u64, "every idle process hibernated (whole: {whole})");
        (arena_pages(), LIVE.load(Ordering::Relaxed))
    };
    let (pages_before, live_before) = spawn_idle(WARM);
    let (pages_after, live_after) = spawn_idle(COUNTED);
    let pages = (pages_after - pages_before) as f64 / COUNTED as f64;
    let heap = (live_after - live_before) as f64 / COUNTED as f64;
    for handle in &handles {
        s.handle().send(handle.pid(), "stop", Payload::empty()).expect("it takes its stop");
    }
    for handle in handles {
        assert_eq!(handle.join_timeout(HANG), Some(Ok(Payload::json(&0).unwrap())));
    }
    (pages, heap)
}

/// Resident pages of the runtime's memory and stack arenas: the mappings of a GiB or
/// more (`Rss` in `/proc/self/smaps`).
fn arena_pages() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps is readable");
    let field = |line: &str, name: &str| -> Option<u64> {
        line.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix(" kB")?.parse().ok()
    };
    let (mut size, mut pages) = (0, 0);
    for line in smaps.lines() {
        if let Some(kib) = field(line, "Size") {
            size = kib;
        } else if let Some(kib) = field(line, "Rss")
            && size >= 1 << 20
        {
            pages += kib / 4;
        }
    }
    pages
}

fn main() {
    let tests: [(&str, fn()); 13] = [
        ("a_yield_cycle_allocates_nothing", a_yield_cycle_allocates_nothing),
        ("a_message_allocates_nothing_beyond_its_payload", a_message_allocates_nothing_beyond_its_payload),
        ("a_wasm_step_allocates_only_what_its_output_needs", a_wasm_step_allocates_only_what_its_output_needs),
        ("a_wasm_message_allocates_only_its_payload", a_wasm_message_allocates_only_its_payload),
        ("a_wasm_message_through_wait_allocates_no_fiber", a_wasm_message_through_wait_allocates_no_fiber),
        ("a_wasm_step_through_wait_allocates_no_fiber", a_wasm_step_through_wait_allocates_no_fiber),
        (
            "a_durable_step_allocates_its_record_not_its_worker_s_vectors",
            a_durable_step_allocates_its_record_not_its_worker_s_vectors,
        ),
        ("a_giant_send_is_refused_before_it_is_copied", a_giant_send_is_refused_before_it_is_copied),
        ("a_giant_answer_is_refused_before_it_is_copied", a_giant_answer_is_refused_before_it_is_copied),
        ("a_mailbox_holds_its_bytes_not_more", a_mailbox_holds_its_bytes_not_more),
        ("a_step_s_output_is_bounded_as_a_whole", a_step_s_output_is_bounded_as_a_whole),
        ("an_idle_sdk_process_touches_eight_pages", an_idle_sdk_process_touches_eight_pages),
        (
            "an_idle_sdk_process_hibernated_whole_keeps_under_six_kib",
            an_idle_sdk_process_hibernated_whole_keeps_under_six_kib,
        ),
    ];
    // `cargo test --test alloc -- NAME…` runs the tests whose names contain a NAME.
    let filters: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with('-')).collect();
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|filter| name.contains(filter.as_str())) {
            continue;
        }
        test();
        println!("test {name} ... ok");
    }
}
