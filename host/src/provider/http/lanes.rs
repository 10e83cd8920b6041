//! Admission of requests: at most so many in flight per process and in all, a FIFO per
//! process for the rest bounded in requests and in bytes, and a refusal past that.
//!
//! # The protocol
//!
//! Each process with requests has a [`Lane`]: its requests in flight and its queue.
//! `ready` is the FIFO of lanes that have a queued request and room under the
//! per-process bound, waiting only for room under the global one.
//!
//! 1. [`Lanes::submit`]: a request starts at once if its lane has nothing queued (so
//!    it cannot overtake its own process's earlier requests), room under the
//!    per-process bound, and there is room under the global one. Otherwise it joins the
//!    lane's queue if that has room, in requests and in bytes (and the lane joins
//!    `ready` if it has room of its own), or it is refused.
//! 2. [`Lanes::finish`]: a request ended, so its lane and the global count each have a
//!    free place. The lane, if it has queued requests, joins `ready` (its own place is
//!    free now); then `ready` lanes start their next request, in FIFO order, while there
//!    is global room; a lane with more queued and still room goes to the back of
//!    `ready`, so lanes take turns.
//!
//! 3. [`Lanes::forget`]: the process ended. Its queue goes at once (nobody is left to
//!    read the answers, and its bytes are charged to no one); what it has in flight
//!    finishes as in step 2.
//!
//! Invariants, checked by the tests: a lane is in `ready` at most once and exactly when
//! it has queued requests and is under its bound; `ready` is non-empty only while the
//! global bound is reached (the step that frees a place drains it); a lane's queued
//! bytes are the sum of its queue's; a lane with nothing in flight and nothing queued is
//! removed, so a process that ended leaves nothing.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::Pid;

/// Whose lane: a process, by its scheduler (one `Http` may serve several, whose pids
/// overlap) and its pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Caller {
    pub(super) scheduler: usize,
    pub(super) pid: Pid,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.pid.fmt(f)
    }
}

/// The bounds: per process in flight, queued and queued bytes, and in flight in all.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    pub(super) in_flight_per_process: usize,
    pub(super) queued_per_process: usize,
    pub(super) queued_bytes_per_process: usize,
    pub(super) in_flight: usize,
}

/// What became of a submitted job.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admit<J> {
    /// Start it now: it is counted in flight.
    Start(J),
    /// It waits in its process's queue; [`Lanes::finish`] hands it out later.
    Queued,
    /// Its process has as many in flight and queued as it may: refuse it.
    Full(J),
    /// The lanes are closed: the provider is stopping.
    Closed(J),
}

/// One process's requests.
struct Lane<J> {
    in_flight: usize,
    /// Each queued job with its size in bytes.
    queue: VecDeque<(usize, J)>,
    /// The sum of the queued jobs' sizes.
    queued_bytes: usize,
    /// Whether the lane is in `Lanes::ready`.
    ready: bool,
}

/// What one process has at the provider, for its refusal's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Load {
    pub(super) in_flight: usize,
    pub(super) queued: usize,
    pub(super) queued_bytes: usize,
}

/// Every process's lane, and the global count. Not synchronised: the caller holds it
/// in a mutex and starts the jobs it hands out after unlocking.
pub(super) struct Lanes<J> {
    bounds: Bounds,
    lanes: FxHashMap<Caller, Lane<J>>,
    ready: VecDeque<Caller>,
    in_flight: usize,
    closed: bool,
}

impl<J> Lanes<J> {
    pub(super) fn new(bounds: Bounds) -> Self {
        Lanes { bounds, lanes: FxHashMap::default(), ready: VecDeque::new(), in_flight: 0, closed: false }
    }

    /// Step 1 of the protocol, for a job of `size` bytes.
    pub(super) fn submit(&mut self, pid: Caller, job: J, size: usize) -> Admit<J> {
        if self.closed {
            return Admit::Closed(job);
        }
        let bounds = self.bounds;
        let global_room = self.in_flight < bounds.in_flight;
        let lane = self.lanes.entry(pid).or_insert_with(|| Lane {
            in_flight: 0,
            queue: VecDeque::new(),
            queued_bytes: 0,
            ready: false,
        });
        let own_room = lane.in_flight < bounds.in_flight_per_process;
        if lane.queue.is_empty() && own_room && global_room {
            lane.in_flight += 1;
            self.in_flight += 1;
            return Admit::Start(job);
        }
        let queued_bytes = lane.queued_bytes.saturating_add(size);
        if lane.queue.len() >= bounds.queued_per_process || queued_bytes > bounds.queued_bytes_per_process {
            if lane.in_flight == 0 && lane.queue.is_empty() {
                // Only with no global room and a queue bound the job alone passes: leave
                // nothing behind.
                self.lanes.remove(&pid);
            }
            return Admit::Full(job);
        }
        lane.queued_bytes = queued_bytes;
        lane.queue.push_back((size, job));
        if own_room && !lane.ready {
            lane.ready = true;
            self.ready.push_back(pid);
        }
        Admit::Queued
    }

    /// Step 2 of the protocol: `pid`'s job ended. Returns the jobs to start now, each
    /// already counted in flight.
    ///
    /// # Panics
    ///
    /// If `pid` has nothing in flight: a job finished that never started.
    pub(super) fn finish(&mut self, pid: Caller) -> Vec<(Caller, J)> {
        let lane = match self.lanes.get_mut(&pid) {
            Some(lane) if lane.in_flight > 0 => lane,
            lane => panic!(
                "inconsistent http lanes: a request of {pid} finished with none in flight; lane in flight = {:?}",
                lane.map(|lane| lane.in_flight)
            ),
        };
        lane.in_flight -= 1;
        self.in_flight -= 1;
        if !lane.queue.is_empty() && !lane.ready {
            lane.ready = true;
            self.ready.push_back(pid);
        }
        if lane.in_flight == 0 && lane.queue.is_empty() {
            self.lanes.remove(&pid);
        }
        let mut start = Vec::new();
        if self.closed {
            return start;
        }
        while self.in_flight < self.bounds.in_flight
            && let Some(next) = self.ready.pop_front()
        {
            let lane = self.lanes.get_mut(&next).expect("a ready lane has queued jobs, so it exists");
            lane.ready = false;
            let (size, job) = lane.queue.pop_front().expect("a ready lane has queued jobs");
            lane.queued_bytes -= size;
            lane.in_flight += 1;
            self.in_flight += 1;
            if !lane.queue.is_empty() && lane.in_flight < self.bounds.in_flight_per_process {
                lane.ready = true;
                self.ready.push_back(next);
            }
            start.push((next, job));
        }
        start
    }

    /// Step 3 of the protocol: `pid` ended. Returns its queued jobs, never to start.
    pub(super) fn forget(&mut self, pid: Caller) -> Vec<J> {
        let Some(lane) = self.lanes.get_mut(&pid) else {
            return Vec::new();
        };
        let queued = lane.queue.drain(..).map(|(_, job)| job).collect();
        lane.queued_bytes = 0;
        if std::mem::take(&mut lane.ready) {
            self.ready.retain(|ready| *ready != pid);
        }
        if lane.in_flight == 0 {
            self.lanes.remove(&pid);
        }
        queued
    }

    /// Stops admitting: every later [`Lanes::submit`] is [`Admit::Closed`] and
    /// [`Lanes::finish`] starts nothing. Returns the queued jobs.
    pub(super) fn close(&mut self) -> Vec<J> {
        self.closed = true;
        self.ready.clear();
        let mut queued = Vec::new();
        self.lanes.retain(|_, lane| {
            queued.extend(lane.queue.drain(..).map(|(_, job)| job));
            lane.queued_bytes = 0;
            lane.ready = false;
            lane.in_flight > 0
        });
        queued
    }

    /// What `pid` has in flight and queued.
    pub(super) fn load(&self, pid: Caller) -> Load {
        self.lanes.get(&pid).map_or(Load { in_flight: 0, queued: 0, queued_bytes: 0 }, |lane| Load {
            in_flight: lane.in_flight,
            queued: lane.queue.len(),
            queued_bytes: lane.queued_bytes,
        })
    }

    #[cfg(test)]
    fn check(&self) {
        let mut total = 0;
        for (pid, lane) in &self.lanes {
            total += lane.in_flight;
            assert!(lane.in_flight > 0 || !lane.queue.is_empty(), "an empty lane of {pid} was kept");
            assert!(lane.in_flight <= self.bounds.in_flight_per_process);
            assert!(lane.queue.len() <= self.bounds.queued_per_process);
            assert_eq!(lane.queued_bytes, lane.queue.iter().map(|(size, _)| size).sum::<usize>());
            assert!(lane.queued_bytes <= self.bounds.queued_bytes_per_process);
            let should = !lane.queue.is_empty() && lane.in_flight < self.bounds.in_flight_per_process;
            assert_eq!(lane.ready, should && !self.closed, "lane of {pid}");
            assert_eq!(self.ready.iter().filter(|p| *p == pid).count(), usize::from(lane.ready));
        }
        assert_eq!(total, self.in_flight);
        assert!(self.in_flight <= self.bounds.in_flight);
        assert!(self.ready.is_empty() || self.in_flight == self.bounds.in_flight, "ready lanes left with room");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(per_process: usize, queued: usize, total: usize) -> Lanes<u32> {
        Lanes::new(Bounds {
            in_flight_per_process: per_process,
            queued_per_process: queued,
            queued_bytes_per_process: usize::MAX,
            in_flight: total,
        })
    }

    /// What the tests mostly submit: a job whose size does not matter.
    const SMALL: usize = 1;

    const A: Caller = Caller { scheduler: 0, pid: Pid::from_u64(1) };
    const B: Caller = Caller { scheduler: 0, pid: Pid::from_u64(2) };

    #[test]
    fn a_process_runs_its_bound_queues_its_bound_and_is_refused_past_both() {
        let mut l = lanes(2, 3, 100);
        assert_eq!(l.submit(A, 1, SMALL), Admit::Start(1));
        assert_eq!(l.submit(A, 2, SMALL), Admit::Start(2));
        for job in 3..=5 {
            assert_eq!(l.submit(A, job, SMALL), Admit::Queued);
        }
        assert_eq!(l.submit(A, 6, SMALL), Admit::Full(6));
        assert_eq!(l.submit(B, 7, SMALL), Admit::Start(7), "another process is not held up");
        assert_eq!(l.load(A), Load { in_flight: 2, queued: 3, queued_bytes: 3 * SMALL });
        l.check();
        assert_eq!(l.finish(A), vec![(A, 3)], "FIFO");
        assert_eq!(l.submit(A, 8, SMALL), Admit::Queued, "behind its own queue");
        assert_eq!(l.finish(A), vec![(A, 4)]);
        assert_eq!(l.finish(A), vec![(A, 5)]);
        assert_eq!(l.finish(A), vec![(A, 8)]);
        assert_eq!(l.finish(A), vec![]);
        assert_eq!(l.finish(A), vec![]);
        assert_eq!(l.finish(B), vec![]);
        l.check();
        assert!(l.lanes.is_empty() && l.in_flight == 0, "nothing left behind");
    }

    #[test]
    fn queued_bytes_are_bounded_per_process() {
        let mut l = Lanes::new(Bounds {
            in_flight_per_process: 1,
            queued_per_process: 100,
            queued_bytes_per_process: 1000,
            in_flight: 100,
        });
        assert_eq!(l.submit(A, 1, 5000), Admit::Start(1), "in flight, not queued: not counted");
        assert_eq!(l.submit(A, 2, 600), Admit::Queued);
        assert_eq!(l.submit(A, 3, 400), Admit::Queued, "up to the bound exactly");
        assert_eq!(l.submit(A, 4, 1), Admit::Full(4));
        assert_eq!(l.load(A), Load { in_flight: 1, queued: 2, queued_bytes: 1000 });
        assert_eq!(l.submit(B, 5, 600), Admit::Start(5), "another process has its own bound");
        assert_eq!(l.submit(B, 6, 1000), Admit::Queued);
        l.check();
        assert_eq!(l.finish(A), vec![(A, 2)]);
        assert_eq!(l.submit(A, 7, 600), Admit::Queued, "the started job's bytes are free again");
        l.check();
    }

    #[test]
    fn an_ended_process_s_queue_goes_at_once() {
        let mut l = lanes(1, 8, 1);
        assert_eq!(l.submit(A, 1, SMALL), Admit::Start(1));
        assert_eq!(l.submit(A, 2, SMALL), Admit::Queued);
        assert_eq!(l.submit(A, 3, SMALL), Admit::Queued);
        assert_eq!(l.submit(B, 4, SMALL), Admit::Queued);
        l.check();
        assert_eq!(l.forget(A), vec![2, 3]);
        l.check();
        assert_eq!(l.load(A), Load { in_flight: 1, queued: 0, queued_bytes: 0 });
        assert_eq!(l.finish(A), vec![(B, 4)], "B's turn, and A has nothing more");
        assert_eq!(l.submit(A, 5, SMALL), Admit::Queued, "a later process of the same pid is served again");
        assert_eq!(l.forget(A), vec![5]);
        l.check();
        assert!(l.forget(B).is_empty(), "nothing queued");
        assert_eq!(l.finish(B), vec![]);
        l.check();
        assert!(l.lanes.is_empty() && l.ready.is_empty(), "nothing left behind");
    }

    #[test]
    fn the_global_bound_shares_places_in_turn() {
        let mut l = lanes(8, 8, 2);
        assert_eq!(l.submit(A, 1, SMALL), Admit::Start(1));
        assert_eq!(l.submit(A, 2, SMALL), Admit::Start(2));
        assert_eq!(l.submit(A, 3, SMALL), Admit::Queued);
        assert_eq!(l.submit(A, 4, SMALL), Admit::Queued);
        assert_eq!(l.submit(B, 10, SMALL), Admit::Queued);
        assert_eq!(l.submit(B, 11, SMALL), Admit::Queued);
        l.check();
        assert_eq!(l.finish(A), vec![(A, 3)], "A was ready first");
        assert_eq!(l.finish(A), vec![(B, 10)], "then B's turn");
        assert_eq!(l.finish(A), vec![(A, 4)]);
        l.check();
        assert_eq!(l.finish(B), vec![(B, 11)]);
        assert_eq!(l.finish(A), vec![]);
        assert_eq!(l.finish(B), vec![]);
        l.check();
        assert!(l.lanes.is_empty());
    }

    #[test]
    fn closing_hands_back_the_queue_and_starts_nothing_more() {
        let mut l = lanes(1, 4, 10);
        assert_eq!(l.submit(A, 1, SMALL), Admit::Start(1));
        assert_eq!(l.submit(A, 2, SMALL), Admit::Queued);
        assert_eq!(l.submit(B, 3, SMALL), Admit::Start(3));
        assert_eq!(l.close(), vec![2]);
        assert_eq!(l.submit(A, 4, SMALL), Admit::Closed(4));
        assert_eq!(l.finish(A), vec![]);
        assert_eq!(l.finish(B), vec![]);
        l.check();
        assert!(l.lanes.is_empty());
    }

    #[test]
    fn a_random_mix_keeps_the_invariants() {
        // A small linear congruential generator: the test needs a varied mix, not quality.
        let mut seed = 0x2545_f491_u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let mut l = Lanes::new(Bounds {
            in_flight_per_process: 3,
            queued_per_process: 4,
            queued_bytes_per_process: 6,
            in_flight: 5,
        });
        let mut running: Vec<Caller> = Vec::new();
        let (mut started, mut finished) = (0, 0);
        for job in 0..10_000 {
            if next(20) == 0 {
                l.forget(Caller { scheduler: 0, pid: Pid::from_u64(1 + next(4)) });
            } else if next(2) == 0 || running.is_empty() {
                let pid = Caller { scheduler: 0, pid: Pid::from_u64(1 + next(4)) };
                match l.submit(pid, job, 1 + next(3) as usize) {
                    Admit::Start(_) => running.push(pid),
                    Admit::Queued | Admit::Full(_) => {}
                    Admit::Closed(_) => unreachable!("never closed here"),
                }
            } else {
                let pid = running.swap_remove(next(running.len() as u64) as usize);
                finished += 1;
                for (pid, _) in l.finish(pid) {
                    started += 1;
                    running.push(pid);
                }
            }
            l.check();
        }
        assert!(started > 100 && finished > 100, "the mix queued and finished: {started} {finished}");
    }
}
