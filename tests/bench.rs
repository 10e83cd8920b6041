//! What the benchmarks share: a [`Sample`] of timed runs (median, min, max) and
//! [`measure_pair`], which alternates two sides so drift on the machine (frequency, other
//! load) affects both alike.

use std::time::Duration;

/// Timed runs of one workload.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// The middle run (the upper middle for an even count).
    pub median: Duration,
    /// The fastest run.
    pub min: Duration,
    /// The slowest run.
    pub max: Duration,
}

impl Sample {
    /// The sample of `times`; there must be at least one.
    pub fn of(mut times: Vec<Duration>) -> Sample {
        assert!(!times.is_empty(), "a sample needs at least one run");
        times.sort();
        Sample { median: times[times.len() / 2], min: times[0], max: times[times.len() - 1] }
    }

    /// This median over `baseline`'s.
    pub fn ratio(&self, baseline: &Sample) -> f64 {
        self.median.as_secs_f64() / baseline.median.as_secs_f64()
    }
}

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(f, "{:.1} ms ({:.1}–{:.1})", ms(self.median), ms(self.min), ms(self.max))
    }
}

/// Runs both sides `warmup` times, then alternates them `runs` times.
pub fn measure_pair(
    runs: usize,
    warmup: usize,
    ours: &mut dyn FnMut() -> Duration,
    theirs: &mut dyn FnMut() -> Duration,
) -> (Sample, Sample) {
    for _ in 0..warmup {
        ours();
        theirs();
    }
    let (mut a, mut b) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        a.push(ours());
        b.push(theirs());
    }
    (Sample::of(a), Sample::of(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_take_the_middle_and_the_ends() {
        let ms = Duration::from_millis;
        let sample = Sample::of(vec![ms(5), ms(1), ms(3)]);
        assert_eq!((sample.median, sample.min, sample.max), (ms(3), ms(1), ms(5)));
        assert_eq!(sample.ratio(&Sample::of(vec![ms(6)])), 0.5);
    }

    #[test]
    fn pairs_alternate_after_the_warmup() {
        let order = std::cell::RefCell::new(Vec::new());
        let (a, b) = measure_pair(
            2,
            1,
            &mut || {
                order.borrow_mut().push('a');
                Duration::from_millis(1)
            },
            &mut || {
                order.borrow_mut().push('b');
                Duration::from_millis(2)
            },
        );
        assert_eq!(order.into_inner(), ['a', 'b', 'a', 'b', 'a', 'b']);
        assert_eq!((a.median, b.median), (Duration::from_millis(1), Duration::from_millis(2)));
    }
}
