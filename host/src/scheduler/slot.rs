//! A worker's LIFO slot (see `worker.rs`, "The LIFO slot"): at most one `Ready` process,
//! which its owner puts in and takes out, and another worker may take out.
//!
//! The slot owns its occupant, an `Arc` turned into a pointer. The pointer only ever
//! changes by a swap, so the owner and a thief can never both take one process, and none
//! is lost: whoever swaps a pointer out owns what it points to. The loom model below
//! checks it for an owner that puts two processes and takes one against a thief.

use std::sync::Arc;

use crate::loom::{AtomicPtr, AtomicU64, Ordering};

pub(super) struct Slot<T> {
    task: AtomicPtr<T>,
    /// How many processes the owner has put in: a thief that sees the same count twice,
    /// with the slot full both times, knows the occupant has not changed in between.
    puts: AtomicU64,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot { task: AtomicPtr::new(std::ptr::null_mut()), puts: AtomicU64::new(0) }
    }
}

impl<T> Slot<T> {
    /// Puts `task` in; the occupant it displaces, if any. Only the owner puts.
    pub(super) fn put(&self, task: Arc<T>) -> Option<Arc<T>> {
        // Only the owner writes the count, so a load and a store keep it exact without a
        // read-modify-write; a thief only compares two of its values.
        self.puts.store(self.puts.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        // Release: the process's state reaches whoever swaps it out (Acquire).
        let previous = self.task.swap(Arc::into_raw(task).cast_mut(), Ordering::AcqRel);
        // SAFETY: every non-null pointer in the slot came from `Arc::into_raw` in `put`,
        // and the swap made this thread its only holder.
        (!previous.is_null()).then(|| unsafe { Arc::from_raw(previous) })
    }

    /// Takes the occupant out, if any.
    pub(super) fn take(&self) -> Option<Arc<T>> {
        let task = self.task.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: as in `put`.
        (!task.is_null()).then(|| unsafe { Arc::from_raw(task) })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.task.load(Ordering::Relaxed).is_null()
    }

    /// The count of processes put in so far.
    pub(super) fn puts(&self) -> u64 {
        self.puts.load(Ordering::Relaxed)
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        drop(self.take());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::Arc;

    use super::Slot;

    /// The owner puts `1`, then `2` (taking back the `1` it displaces, if still there),
    /// then takes what is in the slot; a thief takes once meanwhile. Every process ends
    /// with exactly one of them, or in the slot, whatever the interleaving.
    #[test]
    fn loom_slot_gives_each_process_to_exactly_one_taker() {
        loom::model(|| {
            let slot = Arc::new(Slot::<u32>::default());
            let thief = {
                let slot = slot.clone();
                loom::thread::spawn(move || slot.take().map(|task| *task))
            };
            let mut owned = Vec::new();
            assert!(slot.put(Arc::new(1)).is_none(), "the slot starts empty");
            owned.extend(slot.put(Arc::new(2)).map(|task| *task));
            owned.extend(slot.take().map(|task| *task));
            let stolen = thief.join().expect("the thief does not panic");
            owned.extend(stolen);
            let left = slot.take().map(|task| *task);
            owned.extend(left);
            owned.sort_unstable();
            assert_eq!(owned, [1, 2], "each process taken once, none lost (thief took {stolen:?})");
        });
    }
}
