//! What the benchmarks share: a [`Sample`] of timed runs (median, min, max),
//! [`measure_pair`], which alternates two sides so drift on the machine (frequency, other
//! load) affects both alike, the harness's [`Options`], and the [`Record`]s of a
//! [`Report`]: the table on stdout and `results.json`.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

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

    /// The `q` quantile (0 to 1) of each run's `times`, as a sample over the runs: a
    /// latency's p50 or p99 with its spread from run to run. Every run needs a time.
    pub fn quantile(runs: &[Vec<Duration>], q: f64) -> Sample {
        Sample::of(
            runs.iter()
                .map(|times| {
                    let mut sorted = times.clone();
                    sorted.sort();
                    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
                })
                .collect(),
        )
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

/// Runs one side `warmup` times, then `runs` times.
pub fn measure(runs: usize, warmup: usize, side: &mut dyn FnMut() -> Duration) -> Sample {
    for _ in 0..warmup {
        side();
    }
    Sample::of((0..runs).map(|_| side()).collect())
}

/// What the harness was asked to run: from the environment and the arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Worker threads of the paired workloads (`WORKERS`, default 2: the CI machine
    /// class); the worker sweeps run 1 to this many.
    pub workers: usize,
    /// Measured runs a side after the warm-up (`RUNS`; default 5, or 2 when quick).
    pub runs: usize,
    /// Smaller counts and fewer runs, for development (`QUICK=1`): the figures are not
    /// comparable with a full run's.
    pub quick: bool,
    /// Run only the benchmarks whose names contain one of these (the arguments that are
    /// not flags; cargo passes `--bench` itself). Empty: run all.
    pub filters: Vec<String>,
}

impl Options {
    /// `var` looks up an environment variable; `args` are the arguments after the
    /// program's name. A `WORKERS` or `RUNS` that is not a positive number is ignored.
    pub fn parse(var: impl Fn(&str) -> Option<String>, args: impl IntoIterator<Item = String>) -> Options {
        let number = |name: &str| var(name).and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0);
        let quick = var("QUICK").is_some_and(|v| !matches!(v.trim(), "" | "0" | "false"));
        Options {
            workers: number("WORKERS").unwrap_or(2),
            runs: number("RUNS").unwrap_or(if quick { 2 } else { 5 }),
            quick,
            filters: args.into_iter().filter(|a| !a.starts_with('-')).collect(),
        }
    }

    /// The options of this process.
    pub fn from_env() -> Options {
        Options::parse(|name| std::env::var(name).ok(), std::env::args().skip(1))
    }

    /// Whether the benchmark `name` runs.
    pub fn selected(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }
}

/// Which figure of a [`Record`] a [`Condition`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    /// The median.
    Median,
    /// The ratio to the baseline.
    Ratio,
}

/// A comparison a goal asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// At least the value.
    AtLeast,
    /// At most the value.
    AtMost,
}

/// One condition of a goal: `figure op value`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Condition {
    /// What is compared.
    pub figure: Figure,
    /// How.
    pub op: Op,
    /// With what.
    pub value: f64,
}

impl Condition {
    /// The median must be at least `value`.
    pub fn median_at_least(value: f64) -> Condition {
        Condition { figure: Figure::Median, op: Op::AtLeast, value }
    }

    /// The median must be at most `value`.
    pub fn median_at_most(value: f64) -> Condition {
        Condition { figure: Figure::Median, op: Op::AtMost, value }
    }

    /// The ratio to the baseline must be at most `value`.
    pub fn ratio_at_most(value: f64) -> Condition {
        Condition { figure: Figure::Ratio, op: Op::AtMost, value }
    }

    /// Whether `record` meets it; `None` when the figure is missing (a ratio without a
    /// baseline).
    fn met_by(&self, record: &Record) -> Option<bool> {
        let figure = match self.figure {
            Figure::Median => record.median,
            Figure::Ratio => record.ratio?,
        };
        Some(match self.op {
            Op::AtLeast => figure >= self.value,
            Op::AtMost => figure <= self.value,
        })
    }

    fn to_json(self) -> Value {
        let figure = match self.figure {
            Figure::Median => "median",
            Figure::Ratio => "ratio",
        };
        let op = match self.op {
            Op::AtLeast => ">=",
            Op::AtMost => "<=",
        };
        json!({ "figure": figure, "op": op, "value": self.value })
    }

    fn text(self, unit: &str) -> String {
        let op = match self.op {
            Op::AtLeast => "≥",
            Op::AtMost => "≤",
        };
        match self.figure {
            Figure::Median => format!("{op} {} {unit}", human(self.value)),
            Figure::Ratio => format!("{op} {}×", self.value),
        }
    }
}

/// One metric of the report: a figure of wasmproc's, its spread, what it was compared
/// with in the same run, and the goal it is held to.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Unique in a report, such as `wasm/lifecycle` or `idle/rss-per-process/100k`.
    pub name: String,
    /// The unit of `median`, `min`, `max` and `baseline`, such as `ms` or `steps/s`.
    pub unit: String,
    /// The median over the runs (the only value for a one-run measurement).
    pub median: f64,
    /// The lowest value over the runs.
    pub min: f64,
    /// The highest value over the runs.
    pub max: f64,
    /// The baseline's median, in `unit`, measured in the same run.
    pub baseline: Option<f64>,
    /// wasmproc's cost over the baseline's: its median time over the baseline's median
    /// time, whatever `unit` is, so above 1 means wasmproc is slower (for a rate that is
    /// the baseline's rate over wasmproc's).
    pub ratio: Option<f64>,
    /// Every condition must hold for the goal to be met; empty: no goal.
    pub goal: Vec<Condition>,
}

impl Record {
    /// A record without baseline or goal: every figure is `value` (one run).
    pub fn single(name: impl Into<String>, unit: impl Into<String>, value: f64) -> Record {
        Record {
            name: name.into(),
            unit: unit.into(),
            median: value,
            min: value,
            max: value,
            baseline: None,
            ratio: None,
            goal: Vec::new(),
        }
    }

    /// A timed workload in milliseconds, with its baseline's sample if there is one.
    pub fn time(name: impl Into<String>, ours: &Sample, theirs: Option<&Sample>) -> Record {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Record {
            name: name.into(),
            unit: "ms".to_owned(),
            median: ms(ours.median),
            min: ms(ours.min),
            max: ms(ours.max),
            baseline: theirs.map(|t| ms(t.median)),
            ratio: theirs.map(|t| ours.ratio(t)),
            goal: Vec::new(),
        }
    }

    /// A latency in microseconds against its baseline's sample.
    pub fn micros(name: impl Into<String>, ours: &Sample, theirs: &Sample) -> Record {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        Record {
            name: name.into(),
            unit: "µs".to_owned(),
            median: us(ours.median),
            min: us(ours.min),
            max: us(ours.max),
            baseline: Some(us(theirs.median)),
            ratio: Some(ours.ratio(theirs)),
            goal: Vec::new(),
        }
    }

    /// A timed workload of `work` units as a rate (`unit` per second): the slowest run
    /// gives the minimum. The ratio stays a ratio of times.
    pub fn rate(
        name: impl Into<String>,
        unit: impl Into<String>,
        work: u64,
        ours: &Sample,
        theirs: Option<&Sample>,
    ) -> Record {
        let per_second = |d: Duration| work as f64 / d.as_secs_f64();
        Record {
            name: name.into(),
            unit: unit.into(),
            median: per_second(ours.median),
            min: per_second(ours.max),
            max: per_second(ours.min),
            baseline: theirs.map(|t| per_second(t.median)),
            ratio: theirs.map(|t| ours.ratio(t)),
            goal: Vec::new(),
        }
    }

    /// This record with a baseline measured once: the ratio is `cost_ratio`, which the
    /// caller works out from the two sides' times (see [`Record::ratio`]).
    pub fn with_baseline(mut self, baseline: f64, cost_ratio: f64) -> Record {
        self.baseline = Some(baseline);
        self.ratio = Some(cost_ratio);
        self
    }

    /// This record with `condition` added to its goal.
    pub fn goal(mut self, condition: Condition) -> Record {
        self.goal.push(condition);
        self
    }

    /// Whether the goal is met; `None` without a goal (or without the figure it needs).
    pub fn met(&self) -> Option<bool> {
        if self.goal.is_empty() {
            return None;
        }
        self.goal.iter().map(|c| c.met_by(self)).collect::<Option<Vec<bool>>>().map(|all| all.iter().all(|&m| m))
    }

    /// The goal as a reader would write it, such as `≥ 200k lifecycles/s and ≤ 1.3×`;
    /// empty without a goal.
    pub fn goal_text(&self) -> String {
        self.goal.iter().map(|c| c.text(&self.unit)).collect::<Vec<_>>().join(" and ")
    }

    /// The JSON record of `results.json` (see BENCHMARKS.md for the fields).
    pub fn to_json(&self) -> Value {
        let goal = if self.goal.is_empty() {
            Value::Null
        } else {
            json!({
                "text": self.goal_text(),
                "all": self.goal.iter().map(|c| c.to_json()).collect::<Vec<_>>(),
            })
        };
        json!({
            "name": self.name,
            "unit": self.unit,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "goal": goal,
            "met": self.met(),
        })
    }
}

/// The records of one run of the harness, in the order they were measured.
#[derive(Debug, Default)]
pub struct Report {
    /// What the run measured.
    pub records: Vec<Record>,
}

impl Report {
    /// Adds `record`, printing its row of the table as it comes.
    pub fn push(&mut self, record: Record) {
        println!("{}", row(&record));
        self.records.push(record);
    }

    /// The record named `name`, if it was measured.
    pub fn get(&self, name: &str) -> Option<&Record> {
        self.records.iter().find(|r| r.name == name)
    }

    /// The header of the table [`Report::push`] prints rows of.
    pub fn header() -> String {
        let head = format!(
            "{:<34} {:>26} {:>12} {:>7}  {:<28} {}",
            "benchmark", "median (min–max)", "baseline", "ratio", "goal", "met"
        );
        format!("{head}\n{}", "-".repeat(head.chars().count()))
    }

    /// `results.json`: the options of the run and one record per metric.
    pub fn to_json(&self, options: &Options) -> Value {
        json!({
            "workers": options.workers,
            "runs": options.runs,
            "quick": options.quick,
            "filters": options.filters,
            "records": self.records.iter().map(Record::to_json).collect::<Vec<_>>(),
        })
    }
}

/// A record's row in the table: figures with three significant digits or so.
pub fn row(record: &Record) -> String {
    let figures = format!("{} {} ({}–{})", human(record.median), record.unit, human(record.min), human(record.max));
    let baseline = record.baseline.map_or_else(|| "—".to_owned(), human);
    let ratio = record.ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}"));
    let met = match record.met() {
        None => "",
        Some(true) => "yes",
        Some(false) => "NO",
    };
    let mut line = String::new();
    let _ =
        write!(line, "{:<34} {figures:>26} {baseline:>12} {ratio:>7}  {:<28} {met}", record.name, record.goal_text());
    line
}

/// `value` for a reader: `1.54M`, `212k`, `25.0`, `0.53`.
pub fn human(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{:.2}M", value / 1e6)
    } else if magnitude >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else if magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn samples_take_the_middle_and_the_ends() {
        let sample = Sample::of(vec![ms(5), ms(1), ms(3)]);
        assert_eq!((sample.median, sample.min, sample.max), (ms(3), ms(1), ms(5)));
        assert_eq!(sample.ratio(&Sample::of(vec![ms(6)])), 0.5);
        let even = Sample::of(vec![ms(4), ms(1), ms(3), ms(2)]);
        assert_eq!(even.median, ms(3), "the upper middle");
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

    #[test]
    fn options_come_from_the_environment_and_the_arguments() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
        };
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let defaults = Options::parse(env(&[]), args(&["--bench"]));
        assert_eq!(defaults, Options { workers: 2, runs: 5, quick: false, filters: vec![] });
        assert!(defaults.selected("wasm/lifecycle"));

        let quick = Options::parse(env(&[("QUICK", "1"), ("WORKERS", "1")]), args(&["--bench", "idle", "tree"]));
        assert_eq!(quick, Options { workers: 1, runs: 2, quick: true, filters: args(&["idle", "tree"]) });
        assert!(quick.selected("wasm/tree-10k") && quick.selected("idle/rss") && !quick.selected("wasm/cycles"));

        let odd = Options::parse(env(&[("RUNS", "0"), ("WORKERS", "many"), ("QUICK", "0")]), args(&[]));
        assert_eq!((odd.workers, odd.runs, odd.quick), (2, 5, false), "bad numbers fall back to the defaults");
    }

    #[test]
    fn rates_turn_the_slowest_run_into_the_minimum() {
        let ours = Sample::of(vec![ms(100), ms(200), ms(400)]);
        let theirs = Sample::of(vec![ms(100)]);
        let record = Record::rate("wasm/cycles", "steps/s", 1_000, &ours, Some(&theirs));
        assert_eq!((record.median, record.min, record.max), (5_000.0, 2_500.0, 10_000.0));
        assert_eq!((record.baseline, record.ratio), (Some(10_000.0), Some(2.0)), "the ratio is one of times");
        let time = Record::time("scheduler/skynet", &ours, None);
        assert_eq!((time.median, time.min, time.max, time.ratio), (200.0, 100.0, 400.0, None));
    }

    #[test]
    fn goals_hold_when_every_condition_does() {
        let ours = Sample::of(vec![ms(1_000)]);
        let raw = Sample::of(vec![ms(800)]);
        let record = Record::rate("wasm/lifecycle", "lifecycles/s", 200_000, &ours, Some(&raw))
            .goal(Condition::median_at_least(200_000.0))
            .goal(Condition::ratio_at_most(1.3));
        assert_eq!(record.met(), Some(true));
        assert_eq!(record.goal_text(), "≥ 200k lifecycles/s and ≤ 1.3×");
        let slower = Record { ratio: Some(1.31), ..record.clone() };
        assert_eq!(slower.met(), Some(false));
        let no_baseline = Record { baseline: None, ratio: None, ..record };
        assert_eq!(no_baseline.met(), None, "a ratio goal without a baseline cannot be judged");
        assert_eq!(Record::single("idle/reached/1M", "processes", 5.0).met(), None);
        let small = Record::single("idle/rss-per-process/100k", "KiB", 25.0).goal(Condition::median_at_most(20.0));
        assert_eq!(small.met(), Some(false));
    }

    #[test]
    fn records_become_json_with_every_field() {
        let ours = Sample::of(vec![ms(10)]);
        let record = Record::time("scheduler/skynet", &ours, Some(&Sample::of(vec![ms(20)])))
            .goal(Condition::ratio_at_most(1.0));
        let json = record.to_json();
        assert_eq!(json["name"], "scheduler/skynet");
        assert_eq!(json["unit"], "ms");
        assert_eq!(
            (json["median"].as_f64(), json["min"].as_f64(), json["max"].as_f64()),
            (Some(10.0), Some(10.0), Some(10.0))
        );
        assert_eq!((json["baseline"].as_f64(), json["ratio"].as_f64()), (Some(20.0), Some(0.5)));
        assert_eq!(json["goal"]["text"], "≤ 1×");
        assert_eq!(json["goal"]["all"][0], json!({ "figure": "ratio", "op": "<=", "value": 1.0 }));
        assert_eq!(json["met"], true);
        let bare = Record::single("idle/reached/1M", "processes", 681_984.0).to_json();
        assert!(
            bare["baseline"].is_null() && bare["ratio"].is_null() && bare["goal"].is_null() && bare["met"].is_null()
        );

        let mut report = Report::default();
        report.records.push(record);
        let options = Options { workers: 2, runs: 5, quick: false, filters: vec![] };
        let whole = report.to_json(&options);
        assert_eq!((whole["workers"].as_u64(), whole["records"].as_array().map(Vec::len)), (Some(2), Some(1)));
    }

    #[test]
    fn figures_read_like_a_person_wrote_them() {
        assert_eq!(human(1_540_000.0), "1.54M");
        assert_eq!(human(212_345.0), "212k");
        assert_eq!(human(941.8), "942");
        assert_eq!(human(25.04), "25.0");
        assert_eq!(human(0.534), "0.53");
    }
}
