//! The one [`wasmtime::Engine`] of a runtime, and the thread that drives its epoch.
//!
//! Settings and why:
//! - component model on: processes are components of the `process` world;
//! - on-demand instance allocation, with every linear memory a slot of one
//!   [`MemoryArena`] (`memory.rs`): a live process then costs no memory mapping of its
//!   own. wasmtime's pooling allocator maps about 4 regions an instance, which would stop
//!   a default kernel (`vm.max_map_count` = 65,530) near 16k live processes; the arena
//!   is one mapping whatever the count. The rest of an instance (its `vmctx`, its tables) is
//!   `malloc`'d. The fiber stacks that preemptible steps run on come from a second
//!   arena, [`StackArena`] (`stacks.rs`), for the same reason;
//! - wasmtime's copy-on-write memory images off: it lays them only over memories it
//!   mapped itself (with a custom memory it panics). A component whose data segments
//!   carry at least `image::MIN_IMAGE_BYTES` (CPython, SpiderMonkey) has them taken out at
//!   load and mapped copy-on-write over each new memory by the arena itself (`image.rs`,
//!   `memory.rs`, "Images"); the others' segments (our Rust guests have a few KiB) are
//!   copied into the slot at instantiation. That copy is metered code, one unit of fuel a
//!   byte, so a fuel budget is given once the instance is made (`store::refuel`);
//! - no guard region, and wasmtime's reservation tunable left at 0 (the arena reserves
//!   the slots itself). Compiled code then checks every access, offset included, against
//!   the memory's current size. With a reservation, a memory whose declared maximum fits
//!   in it would instead be checked against the reservation's end, relying on the pages
//!   past the current size to fault; an arena slot is readable and writable to its end,
//!   so that check would let a guest write past its size, where the arena does not zero
//!   (see the zero invariant in `memory.rs`); with `memory_may_move(false)` it would do
//!   so for every memory (the test `accesses_past_the_current_size_trap_offsets_included`
//!   fails with the reservation set to `max_memory`). Explicit bounds checks are the
//!   price of density either way;
//! - memories never move (each is one slot for its life), which lets compiled code treat
//!   a memory's base address as fixed instead of reloading it after calls;
//! - epoch interruption: a guest call gets a deadline in epoch ticks; a background
//!   thread ticks the epoch, and at its next loop header or function entry a guest past
//!   its deadline yields its fiber (a preemptible step) or traps (`init`, or a step
//!   without preemption). Cheaper than fuel, and it bounds wall time, which is what a
//!   time slice is. The same thread, once a second, gives back the arenas' warm slots
//!   that no process took since the last time, and trims the heap after a burst.
//!
//! With on-demand allocation nothing in the engine bounds what one process may create:
//! the store's limiter (`store.rs`) does, with the settings `max_core_instances`,
//! `max_tables`, `max_table_elements` and `max_memories` of [`Config`]. Each memory is a
//! slot of the arena, so the arena has `max_instances × max_memories` slots: with the
//! default of one memory a process, `max_instances` is a count of processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use wasmtime::{Engine, EngineWeak, InstanceAllocationStrategy};

use super::config::Config;
use super::memory::{COOL_EVERY, MemoryArena};
use super::stacks::StackArena;

/// Native stack a guest call may use on the worker thread (wasmtime's default is
/// 512 KiB). Guests keep their own stack in linear memory; this is only for the frames of
/// compiled Wasm, and 256 KiB leaves the rest of a worker's 2 MiB thread stack to the host.
const MAX_WASM_STACK: usize = 256 * 1024;

/// A fiber stack of a preemptible step (see `stacks.rs`): four times [`MAX_WASM_STACK`],
/// which leaves the host code below the guest's frames 768 KiB. Address space only,
/// `max_instances` of them, until touched.
const FIBER_STACK: usize = 4 * MAX_WASM_STACK;

/// Bytes of a freed memory slot that are zeroed in place and kept resident for the next
/// process, instead of being handed back to the kernel with `madvise`: each `madvise`
/// and the page faults after it interrupt the other cores for a TLB flush. 256 KiB covers
/// what our guests touch (their initial memory is 128 KiB); what freed slots retain in
/// all is bounded by [`WARM_SLOTS`].
///
/// Giving every page back makes the next process in the slot fault them in again, and
/// each `madvise` flushes every other core's TLB; on the lifecycle benchmark keeping 64 KiB
/// gained nothing and keeping more than 256 KiB gained nothing reliable (the figures are in
/// `docs/perf/wasm.md`, "Bytes a freed slot keeps").
const KEEP_RESIDENT: usize = 256 * 1024;

/// Free memory slots that keep [`KEEP_RESIDENT`] bytes resident; past it a freed slot
/// gives all its pages back. The bound is what keeps a burst of ended processes from
/// staying resident: unbounded, every slot ever used would keep its pages (gigabytes
/// after 100,000 idle processes end: `docs/perf/wasm.md`). 1,024 slots (at most
/// 256 MiB) is twice the children the lifecycle benchmark keeps in flight; the slots
/// that churn are reused first, so they stay warm. Not tuned beyond that. A slot no
/// process took for a second goes cold: the bound is what a burst may keep for a
/// second, not what a host at rest holds.
const WARM_SLOTS: usize = 1024;

/// The engine's epoch as a number the host can read (wasmtime keeps its own counter to
/// itself). The epoch thread advances both together; a process's CPU time is measured
/// in its ticks (see `process.rs`).
#[derive(Clone, Debug, Default)]
pub(crate) struct EpochClock(Arc<AtomicU64>);

impl EpochClock {
    /// Ticks so far. `Relaxed`: a reading orders nothing, it only samples time.
    pub(crate) fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Builds the engine `config` describes, with its memory arena, and starts its epoch
/// thread.
pub(crate) fn new_engine(config: &Config) -> anyhow::Result<(Engine, EpochClock)> {
    new_engine_with(config, super::memory::max_images())
}

/// [`new_engine`], with at most `max_images` copy-on-write memory images mapped at once
/// (see `memory.rs`).
pub(crate) fn new_engine_with(config: &Config, max_images: usize) -> anyhow::Result<(Engine, EpochClock)> {
    ensure!(config.max_instances > 0, "`max_instances` must be at least 1");
    ensure!(
        config.max_memory >= 64 * 1024,
        "`max_memory` must be at least one Wasm page (64 KiB), got {}",
        config.max_memory
    );
    ensure!(!config.epoch_tick.is_zero(), "`epoch_tick` must be longer than zero");
    ensure!(config.max_memories > 0, "`max_memories` must be at least 1");
    let n = config.max_instances;
    let memory_slots = n.checked_mul(config.max_memories).with_context(|| {
        format!(
            "`max_instances` ({n}) × `max_memories` ({}) memory slots do not fit a u32: lower one of them",
            config.max_memories
        )
    })?;
    // The two reservations are address space, not memory: what they can fail on is an
    // address-space limit (`ulimit -v`), so the errors say which settings multiply into
    // them (with the `wasmproc run` flags that set them) and what to lower.
    let arena = MemoryArena::new(memory_slots, config.max_memory, KEEP_RESIDENT, WARM_SLOTS, max_images).with_context(
        || {
            format!(
                "failed to reserve address space for the {memory_slots} memories of {n} instances of {} bytes \
             ({} bytes in all): lower `max_instances` (`--max-processes`), `max_memory` (`--memory`) or \
             `max_memories` (`--max-memories`), or raise the address-space limit (`ulimit -v`)",
                config.max_memory,
                u128::from(memory_slots) * config.max_memory as u128
            )
        },
    )?;

    let stacks = StackArena::new(n, FIBER_STACK).with_context(|| {
        format!(
            "failed to reserve address space for the fiber stacks of {n} instances of {FIBER_STACK} bytes \
             ({} bytes in all): lower `max_instances` (`--max-processes`), or raise the address-space limit \
             (`ulimit -v`)",
            u128::from(n) * FIBER_STACK as u128
        )
    })?;

    let coolers: Vec<Box<dyn Fn() -> usize + Send>> = vec![Box::new(arena.cooler()), Box::new(stacks.cooler())];
    let mut wasm = wasmtime::Config::new();
    wasm.wasm_component_model(true)
        .epoch_interruption(true)
        .consume_fuel(config.fuel.is_some())
        .allocation_strategy(InstanceAllocationStrategy::OnDemand)
        .with_host_memory(Arc::new(arena))
        // wasmtime 48 panics laying an image over a memory that is not its own mapping.
        .memory_init_cow(false)
        .memory_reservation(0)
        .memory_reservation_for_growth(0)
        .memory_guard_size(0)
        .guard_before_linear_memory(false)
        .memory_may_move(false)
        .max_wasm_stack(MAX_WASM_STACK)
        .with_host_stack(Arc::new(stacks))
        .async_stack_size(FIBER_STACK)
        .parallel_compilation(true);
    let engine = Engine::new(&wasm).map_err(anyhow::Error::from).context("failed to create the wasm engine")?;
    let clock = EpochClock::default();
    start_epoch_thread(engine.weak(), clock.clone(), config.epoch_tick, coolers)?;
    Ok((engine, clock))
}

/// Ticks `engine`'s epoch every `tick` until the engine is dropped, and every
/// [`COOL_EVERY`] calls `coolers` (the arenas' warm slots that nothing took go cold,
/// each one a process's memory released) and trims the heap after a wave of releases
/// (`heap.rs`). The thread holds the engine only weakly, so it never keeps a runtime
/// alive; it notices the drop within one tick and exits.
fn start_epoch_thread(
    engine: EngineWeak,
    clock: EpochClock,
    tick: Duration,
    coolers: Vec<Box<dyn Fn() -> usize + Send>>,
) -> anyhow::Result<()> {
    let cool_every = (COOL_EVERY.as_nanos() / tick.as_nanos().max(1)).max(1);
    thread::Builder::new()
        .name("wasmproc-epoch".to_owned())
        .spawn(move || {
            let mut ticks: u128 = 0;
            loop {
                thread::sleep(tick);
                match engine.upgrade() {
                    Some(engine) => {
                        engine.increment_epoch();
                        clock.0.fetch_add(1, Ordering::Relaxed);
                    }
                    None => return,
                }
                ticks += 1;
                if ticks.is_multiple_of(cool_every) {
                    crate::heap::cooled(coolers.iter().map(|cool| cool()).sum());
                    crate::heap::trim_if_due();
                }
            }
        })
        .context("failed to start the epoch thread")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use wasmtime::{Instance, Module, Store, Trap};

    use super::*;
    use crate::wasm::store::MemoryLimiter;

    const PAGE: i32 = 64 * 1024;

    fn engine(max_instances: u32) -> Engine {
        new_engine(&Config::default().max_instances(max_instances).no_disk_cache()).unwrap().0
    }

    /// A store set up as the host's are: the limiter in force, a deadline far away.
    fn store(engine: &Engine) -> Store<MemoryLimiter> {
        let mut store = Store::new(engine, MemoryLimiter::of(&Config::default()));
        store.limiter(|limiter| limiter);
        store.set_epoch_deadline(1_000_000);
        store
    }

    fn instance(engine: &Engine, store: &mut Store<MemoryLimiter>, wat: &str) -> anyhow::Result<Instance> {
        let module = Module::new(engine, wat::parse_str(wat)?)?;
        Ok(Instance::new(store, &module, &[])?)
    }

    fn call(store: &mut Store<MemoryLimiter>, instance: Instance, name: &str, arg: i32) -> Result<i32, Trap> {
        let func = instance.get_typed_func::<i32, i32>(&mut *store, name).unwrap();
        func.call(store, arg).map_err(|e| *e.downcast_ref::<Trap>().expect("a trap"))
    }

    const ACCESSES: &str = r#"
        (func (export "load") (param i32) (result i32) (i32.load (local.get 0)))
        (func (export "load_offset") (param i32) (result i32) (i32.load offset=65536 (local.get 0)))
        (func (export "store") (param i32) (result i32) (i32.store (local.get 0) (i32.const -1)) (i32.const 0))
        (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0)))"#;

    /// The arena's slots are readable and writable to their end, so only the compiled
    /// bounds checks stop an access past a memory's size: they must use the current size,
    /// offsets included, also for a memory whose declared maximum fits in a slot (the case
    /// a reservation would have let the compiler check against the slot's end instead).
    #[test]
    fn accesses_past_the_current_size_trap_offsets_included() {
        let engine = engine(2);
        for memory in ["(memory 1)", "(memory 1 4)"] {
            let mut store = store(&engine);
            let instance = instance(&engine, &mut store, &format!("(module {memory} {ACCESSES})")).unwrap();
            let oob = Err(Trap::MemoryOutOfBounds);
            assert_eq!(call(&mut store, instance, "load", PAGE - 4), Ok(0), "{memory}");
            assert_eq!(call(&mut store, instance, "load", PAGE - 3), oob, "{memory}");
            assert_eq!(call(&mut store, instance, "store", PAGE), oob, "{memory}");
            assert_eq!(call(&mut store, instance, "load_offset", 0), oob, "{memory}");
            assert_eq!(call(&mut store, instance, "grow", 1), Ok(1), "{memory}");
            assert_eq!(call(&mut store, instance, "store", PAGE), Ok(0), "{memory}");
            assert_eq!(call(&mut store, instance, "load_offset", 0), Ok(-1), "{memory}");
            assert_eq!(call(&mut store, instance, "load_offset", PAGE - 3), oob, "{memory}");
            assert_eq!(call(&mut store, instance, "load", 2 * PAGE - 3), oob, "{memory}");
        }
    }

    /// What one process wrote, below and past `KEEP_RESIDENT`, is gone for the next
    /// process in the same slot, including in pages it only reaches by growing.
    #[test]
    fn the_next_process_in_a_slot_finds_it_zeroed() {
        let engine = engine(1);
        let module = format!("(module (memory 1) {ACCESSES})");
        let addresses = [100, 200_000, 1_000_000, 40 * PAGE - 4];
        for tenant in 0..3 {
            let mut store = store(&engine);
            let instance = instance(&engine, &mut store, &module).unwrap();
            assert_eq!(call(&mut store, instance, "grow", 39), Ok(1));
            for address in addresses {
                assert_eq!(call(&mut store, instance, "load", address), Ok(0), "tenant {tenant}, address {address}");
                assert_eq!(call(&mut store, instance, "store", address), Ok(0));
            }
        }
    }

    #[test]
    fn instances_past_max_instances_fail_naming_it() {
        let engine = engine(2);
        let module = "(module (memory 1))";
        let mut first = store(&engine);
        instance(&engine, &mut first, module).unwrap();
        let mut second = store(&engine);
        instance(&engine, &mut second, module).unwrap();
        let error = format!("{:#}", instance(&engine, &mut store(&engine), module).unwrap_err());
        assert!(error.contains("`max_instances` reached: all 2"), "{error}");
        drop(first);
        instance(&engine, &mut store(&engine), module).expect("the first store's slot is free again");
    }

    /// A split component runs through wasmtime with its image, mapped or copied: every
    /// instance reads the segments' bytes and writes its own pages alone.
    #[test]
    fn a_split_component_reads_its_image_mapped_or_copied() {
        use wasmtime::component::{Component, Linker};

        use crate::wasm::image;

        let bytes = image::tests::component(32, &[(65536, vec![7u8; image::MIN_IMAGE_BYTES]), (100, vec![5])]);
        let (split, guest_image) = image::split_with_image(&bytes).expect("a large image");
        let engine = new_engine_with(&Config::default().max_instances(4).no_disk_cache(), 1).unwrap().0;
        let component = Component::new(&engine, &split.stripped).unwrap();
        let linker = Linker::new(&engine);
        let mut live = Vec::new();
        for i in 0..3 {
            let mut store = store(&engine);
            let instance =
                image::instantiating(Some(&guest_image), || linker.instantiate(&mut store, &component)).unwrap();
            let load = instance.get_typed_func::<(u32,), (u32,)>(&mut store, "load").unwrap();
            let store_at = instance.get_typed_func::<(u32,), ()>(&mut store, "store").unwrap();
            let at = |store: &mut Store<MemoryLimiter>, address| load.call(store, (address,)).unwrap().0;
            assert_eq!(at(&mut store, 100), 5, "instance {i}");
            assert_eq!(at(&mut store, 65536 + 4096 * 3), 7, "instance {i}");
            assert_eq!(at(&mut store, 99), 0, "instance {i}");
            store_at.call(&mut store, (65536 + 4096 * i,)).unwrap();
            assert_eq!(at(&mut store, 65536 + 4096 * i), 9);
            assert_eq!(at(&mut store, 65536 + 4096 * (i + 1)), 7, "only its own write");
            live.push(store);
        }
        let unsplit = Component::new(&engine, &split.stripped).unwrap();
        let mut store = store(&engine);
        let error = linker
            .instantiate(&mut store, &unsplit)
            .map(|_| ())
            .and_then(|()| image::instantiating(Some(&guest_image), || Ok(())));
        assert!(error.is_err(), "an image no memory took is an error");
    }

    /// The point of the arena: live instances add no memory mappings (wasmtime's pooling
    /// allocator adds ~4 each). Other tests run alongside and may add a few (thread stacks), hence the slack.
    #[cfg(target_os = "linux")]
    #[test]
    fn live_instances_cost_no_memory_mapping() {
        let count = || std::fs::read_to_string("/proc/self/maps").unwrap().lines().count();
        const INSTANCES: usize = 2_000;
        let engine = engine(INSTANCES as u32);
        let module = Module::new(&engine, wat::parse_str(format!("(module (memory 1) {ACCESSES})")).unwrap()).unwrap();
        let before = count();
        let live: Vec<_> = (0..INSTANCES)
            .map(|_| {
                let mut store = store(&engine);
                let instance = Instance::new(&mut store, &module, &[]).unwrap();
                call(&mut store, instance, "store", 8).unwrap();
                store
            })
            .collect();
        let added = count().saturating_sub(before);
        assert!(added < INSTANCES / 20, "{INSTANCES} live instances added {added} mappings");
        drop(live);
    }
}
