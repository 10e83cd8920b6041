//! The allocation of a preemptible step's future, kept by the thread for the next step.
//!
//! A step on a fiber is a future that must outlive its turn when it is preempted (it owns
//! the store it runs on), so it lives in a box. Nearly every step ends within its first
//! poll, and its box is free again at once: each thread keeps the last one, emptied, and
//! the next step's future is written into it when the layouts agree. Steps then cost the
//! host no allocation for their futures; a preempted step keeps its box, and the next
//! step on that thread makes a new one. The write copies the whole future (a few hundred
//! bytes), which `Box::pin` would have built in place: about what the allocation and its
//! free cost (docs/perf/full-runs.md, "Commands resolved once a worker"), so the gain is a
//! hot path that leaves the allocator alone, not time.

use std::alloc::Layout;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;

/// An allocation made by the global allocator with `layout`, holding no value.
struct Spare {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for Spare {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated by the global allocator with `layout` (a box's,
        // never of size zero: see `recycle`) and is owned by this value alone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

thread_local! {
    static SPARE: Cell<Option<Spare>> = const { Cell::new(None) };
}

/// `future`, boxed: in this thread's spare allocation if it has `F`'s layout.
pub(crate) fn boxed<T, F>(future: F) -> Pin<Box<dyn Future<Output = T> + Send>>
where
    F: Future<Output = T> + Send + 'static,
{
    let layout = Layout::new::<F>();
    match SPARE.take() {
        Some(spare) if spare.layout == layout => {
            let spare = std::mem::ManuallyDrop::new(spare);
            let ptr = spare.ptr.cast::<F>().as_ptr();
            // SAFETY: `ptr` was allocated by the global allocator with `F`'s layout and
            // holds no value; once `F` is written there it is what `Box::new` makes, and
            // the box owns the allocation from here (the spare is not dropped).
            unsafe {
                ptr.write(future);
                Box::into_pin(Box::from_raw(ptr))
            }
        }
        // A spare of another layout is freed here.
        _ => Box::pin(future),
    }
}

/// Drops `future`, which has returned, and keeps its allocation as this thread's spare.
pub(crate) fn recycle<T>(future: Pin<Box<dyn Future<Output = T> + Send>>) {
    // SAFETY: the value is dropped where it lies, as a pinned value must be, and its
    // memory is not used again until `boxed` writes a new value there.
    let raw = Box::into_raw(unsafe { Pin::into_inner_unchecked(future) });
    // SAFETY: `raw` comes from a box: valid, owned here, dropped once.
    let layout = unsafe { Layout::for_value(&*raw) };
    unsafe { std::ptr::drop_in_place(raw) };
    match NonNull::new(raw.cast::<u8>()) {
        // A box of a zero-sized value owns no allocation.
        Some(ptr) if layout.size() > 0 => SPARE.set(Some(Spare { ptr, layout })),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(value: u64) -> impl Future<Output = u64> + Send + 'static {
        // Held on the heap, so that dropping the future frees something of its own.
        let held: Vec<u64> = std::iter::repeat_n(value, 4).collect();
        async move { held.iter().sum::<u64>() / 4 }
    }

    fn poll<T>(future: &mut Pin<Box<dyn Future<Output = T> + Send>>) -> T {
        let waker = std::task::Waker::noop();
        match future.as_mut().poll(&mut std::task::Context::from_waker(waker)) {
            std::task::Poll::Ready(value) => value,
            std::task::Poll::Pending => unreachable!("the future is ready at once"),
        }
    }

    /// The next future of the same type lands where the last one was, and still runs
    /// (and drops what it holds) correctly; one of another layout gets a box of its own.
    #[test]
    fn a_returned_futures_allocation_is_reused_by_the_next() {
        let mut first = boxed(ready(7));
        assert_eq!(poll(&mut first), 7);
        let at = std::ptr::from_ref(&*first).cast::<u8>();
        recycle(first);
        let mut second = boxed(ready(9));
        assert_eq!(std::ptr::from_ref(&*second).cast::<u8>(), at);
        assert_eq!(poll(&mut second), 9);
        recycle(second);
        let big = [1u64; 64];
        let mut other = boxed(async move { big.iter().sum::<u64>() });
        assert_ne!(std::ptr::from_ref(&*other).cast::<u8>(), at);
        assert_eq!(poll(&mut other), 64);
        // Not polled to the end: dropped as any box.
        drop(boxed(ready(1)));
    }
}
