//! Running several futures of one process at once: [`join_all`], [`join`], [`select`],
//! [`select_any`].
//!
//! Each combinator polls its futures inside the process's single task, so the commands
//! they reach in the same step are in flight together. Every child future gets a waker of
//! its own, and a poll of the combinator polls only the children woken since the last
//! one, in the order they were woken. The executor wakes futures in the order their
//! events arrived, and the host delivers completions in completion order, so children
//! resume in the order their commands finished, even when several finish within one step.
//!
//! The children are boxed, so any future will do, pinned or not.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// Runs every future of `futures` at once and resolves to their values, in the order
/// given, or to the first error: the remaining futures are then dropped (their commands
/// still run on the host; their completions are ignored).
///
/// ```
/// # use wasmproc_guest::prelude::*;
/// async fn spawn_all(ctx: &Ctx, n: u32) -> Result<Vec<Pid>, Error> {
///     join_all((0..n).map(|i| ctx.spawn("square", i))).await
/// }
/// ```
pub fn join_all<I, T, E>(futures: I) -> JoinAll<I::Item>
where
    I: IntoIterator,
    I::Item: Future<Output = Result<T, E>>,
{
    let slots: Vec<_> = futures.into_iter().map(|future| MaybeDone::Running(Box::pin(future))).collect();
    JoinAll { running: slots.len(), wakeups: Wakeups::new(slots.len()), slots }
}

/// The future of [`join_all`].
#[must_use = "futures do nothing unless polled"]
pub struct JoinAll<F: Future> {
    slots: Vec<MaybeDone<F>>,
    running: usize,
    wakeups: Wakeups,
}

// Nothing is ever pinned in place: the futures are boxed and outputs only moved.
impl<F: Future> Unpin for JoinAll<F> {}

impl<F, T, E> Future for JoinAll<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<Vec<T>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut ready = this.wakeups.take_ready(cx);
        for &index in &ready {
            let Some(slot) = this.slots.get_mut(index) else { continue };
            if slot.poll(this.wakeups.waker(index)) {
                if let MaybeDone::Done(Err(_)) = slot
                    && let Err(error) = slot.take()
                {
                    return Poll::Ready(Err(error));
                }
                this.running -= 1;
            }
        }
        this.wakeups.give_back(&mut ready);
        if this.running > 0 {
            return Poll::Pending;
        }
        let values: Result<Vec<T>, E> = this.slots.iter_mut().map(MaybeDone::take).collect();
        Poll::Ready(values)
    }
}

/// Runs `a` and `b` at once and resolves to both outputs.
///
/// ```
/// # use wasmproc_guest::prelude::*;
/// async fn two_naps(ctx: &Ctx) {
///     // Both sleeps run together: this takes 20 ms, not 30.
///     join(ctx.sleep(Duration::from_millis(10)), ctx.sleep(Duration::from_millis(20))).await;
/// }
/// ```
pub fn join<A: Future, B: Future>(a: A, b: B) -> Join<A, B> {
    Join { a: MaybeDone::Running(Box::pin(a)), b: MaybeDone::Running(Box::pin(b)), wakeups: Wakeups::new(2) }
}

/// The future of [`join`].
#[must_use = "futures do nothing unless polled"]
pub struct Join<A: Future, B: Future> {
    a: MaybeDone<A>,
    b: MaybeDone<B>,
    wakeups: Wakeups,
}

// Nothing is ever pinned in place: the futures are boxed and outputs only moved.
impl<A: Future, B: Future> Unpin for Join<A, B> {}

impl<A: Future, B: Future> Future for Join<A, B> {
    type Output = (A::Output, B::Output);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut ready = this.wakeups.take_ready(cx);
        for &index in &ready {
            let waker = this.wakeups.waker(index);
            if index == 0 {
                this.a.poll(waker);
            } else {
                this.b.poll(waker);
            }
        }
        this.wakeups.give_back(&mut ready);
        match (&this.a, &this.b) {
            (MaybeDone::Done(_), MaybeDone::Done(_)) => Poll::Ready((this.a.take(), this.b.take())),
            _ => Poll::Pending,
        }
    }
}

/// Which of two futures finished first, with its output.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Either<A, B> {
    /// The first future finished first.
    Left(A),
    /// The second future finished first.
    Right(B),
}

/// Runs `a` and `b` at once and resolves to the output of the first to finish; the other
/// is dropped (its command still runs on the host; its completion is ignored). Of two
/// events arriving in the same step the earlier one wins; if both futures are ready at
/// their first poll, `a` does.
///
/// ```
/// # use wasmproc_guest::prelude::*;
/// async fn next_or_timeout(ctx: &Ctx) -> Result<Option<Message>, Error> {
///     match select(ctx.recv(), ctx.sleep(Duration::from_secs(1))).await {
///         Either::Left(message) => Ok(Some(message?)),
///         Either::Right(slept) => slept.map(|()| None),
///     }
/// }
/// ```
pub fn select<A: Future, B: Future>(a: A, b: B) -> Select<A, B> {
    Select { a: Some(Box::pin(a)), b: Some(Box::pin(b)), wakeups: Wakeups::new(2) }
}

/// The future of [`select`].
#[must_use = "futures do nothing unless polled"]
pub struct Select<A, B> {
    a: Option<Pin<Box<A>>>,
    b: Option<Pin<Box<B>>>,
    wakeups: Wakeups,
}

impl<A: Future, B: Future> Future for Select<A, B> {
    type Output = Either<A::Output, B::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let (Some(a), Some(b)) = (&mut this.a, &mut this.b) else {
            panic!("`Select` polled after it resolved");
        };
        let mut ready = this.wakeups.take_ready(cx);
        let mut output = None;
        for &index in &ready {
            let mut cx = Context::from_waker(this.wakeups.waker(index));
            let poll = if index == 0 {
                a.as_mut().poll(&mut cx).map(Either::Left)
            } else {
                b.as_mut().poll(&mut cx).map(Either::Right)
            };
            if let Poll::Ready(first) = poll {
                output = Some(first);
                break;
            }
        }
        this.wakeups.give_back(&mut ready);
        match output {
            Some(output) => {
                // The loser goes now, so its completion is ignored from this step on.
                this.a = None;
                this.b = None;
                Poll::Ready(output)
            }
            None => Poll::Pending,
        }
    }
}

/// Runs every future of `futures` at once and resolves to the index and output of the
/// first to finish; the others are dropped (their commands still run on the host; their
/// completions are ignored). Of events arriving in the same step the earliest wins; of
/// futures ready at their first poll, the first in order. The n-ary [`select`]: futures
/// of different types can be mapped to one (an enum, or a boxed future).
///
/// Given no future at all it never resolves.
///
/// ```
/// # use wasmproc_guest::prelude::*;
/// /// The first of several workers to answer, by its place in `workers`.
/// async fn first_answer(ctx: &Ctx, workers: &[Pid]) -> Result<usize> {
///     let (index, _answer) = select_any(workers.iter().map(|&pid| ctx.wait::<u64>(pid))).await;
///     Ok(index)
/// }
/// ```
pub fn select_any<I>(futures: I) -> SelectAny<I::Item>
where
    I: IntoIterator,
    I::Item: Future,
{
    let futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    SelectAny { wakeups: Wakeups::new(futures.len()), futures }
}

/// The future of [`select_any`].
#[must_use = "futures do nothing unless polled"]
pub struct SelectAny<F> {
    futures: Vec<Pin<Box<F>>>,
    wakeups: Wakeups,
}

impl<F: Future> Future for SelectAny<F> {
    type Output = (usize, F::Output);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut ready = this.wakeups.take_ready(cx);
        let mut output = None;
        for &index in &ready {
            let Some(future) = this.futures.get_mut(index) else { continue };
            if let Poll::Ready(first) = future.as_mut().poll(&mut Context::from_waker(this.wakeups.waker(index))) {
                output = Some((index, first));
                break;
            }
        }
        this.wakeups.give_back(&mut ready);
        if output.is_some() {
            // The losers go now, so their completions are ignored from this step on.
            this.futures.clear();
        }
        output.map_or(Poll::Pending, Poll::Ready)
    }
}

/// A child future and, once it has finished, its output.
enum MaybeDone<F: Future> {
    Running(Pin<Box<F>>),
    Done(F::Output),
    Taken,
}

impl<F: Future> MaybeDone<F> {
    /// Polls the future with `waker` if it is still running; whether it has finished.
    fn poll(&mut self, waker: &Waker) -> bool {
        match self {
            MaybeDone::Running(future) => match future.as_mut().poll(&mut Context::from_waker(waker)) {
                Poll::Ready(output) => {
                    *self = MaybeDone::Done(output);
                    true
                }
                Poll::Pending => false,
            },
            MaybeDone::Done(_) => true,
            MaybeDone::Taken => panic!("a joined future was polled after the join resolved"),
        }
    }

    fn take(&mut self) -> F::Output {
        match std::mem::replace(self, MaybeDone::Taken) {
            MaybeDone::Done(output) => output,
            _ => panic!("inconsistent join state: an output was taken before it was ready"),
        }
    }
}

/// The children of one combinator that were woken since its last poll, in wake order.
struct Wakeups {
    queue: Arc<Mutex<Queue>>,
    /// One per child, handed to it on every poll.
    wakers: Vec<Waker>,
    /// The previous poll's list, kept so a steady state does not allocate.
    spare: Vec<usize>,
}

struct Queue {
    woken: Vec<usize>,
    /// The combinator's own waker, from its latest poll.
    parent: Option<Waker>,
}

/// Wakes child `index` of a combinator: queues it, then wakes the combinator.
struct ChildWaker {
    index: usize,
    queue: Arc<Mutex<Queue>>,
}

impl Wake for ChildWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let parent = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if !queue.woken.contains(&self.index) {
                queue.woken.push(self.index);
            }
            queue.parent.clone()
        };
        // Outside the lock: the parent's waker may be another combinator's child waker.
        if let Some(parent) = parent {
            parent.wake();
        }
    }
}

impl Wakeups {
    /// Wakeups for `children` children, all of them queued, so the first poll polls each
    /// in order.
    fn new(children: usize) -> Self {
        let queue = Arc::new(Mutex::new(Queue { woken: (0..children).collect(), parent: None }));
        let wakers = (0..children).map(|index| Waker::from(Arc::new(ChildWaker { index, queue: queue.clone() })));
        Wakeups { wakers: wakers.collect(), queue, spare: Vec::new() }
    }

    /// Takes the children woken so far, in wake order, and makes `cx`'s waker the one
    /// later wakeups wake.
    fn take_ready(&mut self, cx: &Context<'_>) -> Vec<usize> {
        let mut ready = std::mem::take(&mut self.spare);
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut queue.parent {
            Some(parent) => parent.clone_from(cx.waker()),
            None => queue.parent = Some(cx.waker().clone()),
        }
        std::mem::swap(&mut queue.woken, &mut ready);
        ready
    }

    /// Returns the list [`Wakeups::take_ready`] handed out, for reuse.
    fn give_back(&mut self, ready: &mut Vec<usize>) {
        ready.clear();
        self.spare = std::mem::take(ready);
    }

    fn waker(&self, index: usize) -> &Waker {
        &self.wakers[index]
    }
}
