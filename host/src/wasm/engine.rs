//! The one [`wasmtime::Engine`] of a runtime, and the thread that drives its epoch.
//!
//! Settings and why:
//! - component model on: processes are components of the `process` world;
//! - pooling allocator: instantiation takes a pre-reserved slot instead of mapping memory
//!   afresh, and a finished process's slot is reused at once;
//! - copy-on-write memory images: a new instance maps its module's data instead of
//!   copying it, so spawning costs the same whatever the guest's data size;
//! - small reservations: each memory slot reserves exactly the memory cap plus a small
//!   guard, instead of wasmtime's 4 GiB + 32 MiB default, so many thousands of slots fit
//!   in the address space. Bounds checks are then explicit in the generated code, which
//!   is the price of density;
//! - epoch interruption: a guest call gets a deadline in epoch ticks; a background
//!   thread ticks the epoch, and a guest past its deadline traps at its next loop header
//!   or function entry. Cheaper than fuel, and it bounds wall time, which is what a time
//!   slice is.

use std::thread;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use wasmtime::{Engine, EngineWeak, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::config::Config;

/// Core instances one process may use. A Rust `wasm32-wasip2` guest has 4 (its module
/// plus the shim and fixup modules that `wasm-component-ld` adds for indirect calls);
/// twice that leaves room for other toolchains without letting one component take a
/// large share of the pool.
const CORE_INSTANCES_PER_PROCESS: u32 = 8;

/// Tables one process may use: a Rust guest has 2 (its function table and the shim's).
const TABLES_PER_PROCESS: u32 = 4;

/// Elements of one table. Each table slot reserves 8 bytes per element, so this bounds
/// the pool's table reservation; a guest with more indirect-call targets than this
/// fails to instantiate with an error saying so. wasmtime's default is 20,000, which no
/// guest of ours approaches.
const TABLE_ELEMENTS: usize = 10_000;

/// Guard pages after (and before) each linear memory. With reservations under 4 GiB the
/// compiled code checks bounds explicitly, so the guard only lets it fold small constant
/// offsets into those checks; 64 KiB (one Wasm page) covers the common ones.
const GUARD: u64 = 64 * 1024;

/// Native stack a guest call may use on the worker thread (wasmtime's default is
/// 512 KiB). Guests keep their own stack in linear memory; this is only for the frames of
/// compiled Wasm, and 256 KiB leaves the rest of a worker's 2 MiB thread stack to the host.
const MAX_WASM_STACK: usize = 256 * 1024;

/// Bytes of a freed slot's linear memory (and tables) that are zeroed in place and kept
/// resident for the next process, instead of being handed back to the kernel with
/// `madvise`. Measured on the lifecycle benchmark (2 cores): each `madvise` and the page
/// faults after it interrupt the other core for a TLB flush, which held both wasmproc and
/// raw wasmtime to ~27k lifecycles/s; keeping 256 KiB resident gave ~164k/s, 1 MiB
/// 118–218k/s, 64 KiB nothing. 256 KiB covers what our guests touch (their initial
/// memory is 128 KiB) while bounding what idle slots retain: at most
/// `max_instances × 256 KiB`, and only for slots that have been used.
const KEEP_RESIDENT: usize = 256 * 1024;

/// Builds the engine `config` describes.
pub(crate) fn new_engine(config: &Config) -> anyhow::Result<Engine> {
    ensure!(config.max_instances > 0, "`max_instances` must be at least 1");
    ensure!(
        config.max_memory >= 64 * 1024,
        "`max_memory` must be at least one Wasm page (64 KiB), got {}",
        config.max_memory
    );
    ensure!(!config.epoch_tick.is_zero(), "`epoch_tick` must be longer than zero");
    let n = config.max_instances;
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_PROCESS))
        .max_core_instances_per_component(CORE_INSTANCES_PER_PROCESS)
        .total_memories(n)
        .max_memories_per_component(1)
        .max_memory_size(config.max_memory)
        .total_tables(n.saturating_mul(TABLES_PER_PROCESS))
        .max_tables_per_component(TABLES_PER_PROCESS)
        .table_elements(TABLE_ELEMENTS)
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT);

    let mut wasm = wasmtime::Config::new();
    wasm.wasm_component_model(true)
        .epoch_interruption(true)
        .consume_fuel(config.fuel.is_some())
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .memory_init_cow(true)
        .memory_reservation(config.max_memory as u64)
        .memory_reservation_for_growth(0)
        .memory_guard_size(GUARD)
        .max_wasm_stack(MAX_WASM_STACK)
        .parallel_compilation(true);
    let engine = Engine::new(&wasm).map_err(anyhow::Error::from).with_context(|| {
        format!("failed to create the wasm engine ({} instances of {} bytes)", n, config.max_memory)
    })?;
    start_epoch_thread(engine.weak(), config.epoch_tick)?;
    Ok(engine)
}

/// Ticks `engine`'s epoch every `tick` until the engine is dropped. The thread holds the
/// engine only weakly, so it never keeps a runtime alive; it notices the drop within one
/// tick and exits.
fn start_epoch_thread(engine: EngineWeak, tick: Duration) -> anyhow::Result<()> {
    thread::Builder::new()
        .name("wasmproc-epoch".to_owned())
        .spawn(move || {
            loop {
                thread::sleep(tick);
                match engine.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .context("failed to start the epoch thread")?;
    Ok(())
}

/// Memory mappings one live instance costs with copy-on-write memory images, measured
/// with wasmtime 48's pooling allocator on Linux (DESIGN §7: about 4 with images, 2
/// without).
const MAPPINGS_PER_INSTANCE: u64 = 4;

/// A warning if `max_instances` live instances would need more memory mappings than the
/// kernel allows a process (`vm.max_map_count`, 65,530 by default): past that,
/// instantiation fails with "Cannot allocate memory", which says nothing about why.
/// `None` when they fit, or when the limit cannot be read (not Linux).
pub(crate) fn map_count_warning(max_instances: u32) -> Option<String> {
    let limit: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok()?;
    map_count_warning_for(max_instances, limit)
}

fn map_count_warning_for(max_instances: u32, limit: u64) -> Option<String> {
    // Headroom for the host's own mappings (code, heaps, thread stacks).
    let needed = u64::from(max_instances) * MAPPINGS_PER_INSTANCE + 1024;
    (needed > limit).then(|| {
        format!(
            "`max_instances` is {max_instances}, but the kernel allows {limit} memory mappings per process \
             (`vm.max_map_count`) and each live Wasm process costs about {MAPPINGS_PER_INSTANCE}: spawns will fail \
             with \"Cannot allocate memory\" past about {} live processes; raise the limit \
             (`sysctl -w vm.max_map_count={needed}`) or lower `max_instances`",
            limit.saturating_sub(1024) / MAPPINGS_PER_INSTANCE
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_count_warning_names_the_sysctl_only_when_the_pool_does_not_fit() {
        assert_eq!(map_count_warning_for(10_000, 65_530), None);
        let warning = map_count_warning_for(100_000, 65_530).expect("100k instances need ~400k mappings");
        assert!(warning.contains("vm.max_map_count=401024"), "{warning}");
        assert!(warning.contains("past about 16126 live processes"), "{warning}");
    }
}
