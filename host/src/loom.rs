//! Swaps the synchronisation primitives of the wakeup protocol for loom's under
//! `--cfg loom`, so the model checker explores every interleaving of the real code.
//!
//! The per-process protocol (state word, inbox, process slot) and the workers' LIFO
//! slots go through this shim; the workers' deques and parking use crossbeam and
//! parking_lot directly and are not part of the models.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// A mutex with parking_lot's interface (no poisoning) over either implementation.
pub(crate) struct Mutex<T>(#[cfg(not(loom))] parking_lot::Mutex<T>, #[cfg(loom)] loom::sync::Mutex<T>);

#[cfg(not(loom))]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(parking_lot::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
        self.0.lock()
    }
}

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        // loom's mutex poisons only if a model thread panicked, and then the model has
        // already failed.
        self.0.lock().expect("loom mutex poisoned by a failed model thread")
    }
}
