//! A tour of the scheduler with native processes: a spawn tree, messages, a custom
//! command, and the stats at the end.
//!
//! `cargo run --release -p wasmproc --example native`

use std::time::{Duration, Instant};

use wasmproc::handler::Request;
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::{
    Capabilities, Command, Event, Events, Payload, Port, Process, Scheduler, SpawnRequest, Status, StepOutput,
};

/// Sums 0..n by splitting the range among 10 children until a range is a single number.
#[derive(Default)]
struct Tree {
    start: u64,
    len: u64,
    sum: u64,
    exits: u32,
    spawned: bool,
}

impl Process for Tree {
    fn init(&mut self, _: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        anyhow::ensure!(method == "sum", "unknown entry method `{method}`; entries: sum");
        let range: (u64, u64) = input.first().ok_or_else(|| anyhow::anyhow!("missing input"))?.parse_json()?;
        (self.start, self.len) = range;
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if self.len == 1 {
            out.complete(Ok(Payload::json(&self.start)?));
            return Ok(());
        }
        for event in events {
            if let Event::Exit { reason, .. } = event {
                // A child that ended abnormally ends this one with its reason.
                self.sum += reason.into_result()?.parse_json::<u64>()?;
                self.exits += 1;
            }
        }
        if !self.spawned {
            self.spawned = true;
            let part = self.len / 10;
            for i in 0..10 {
                let input = vec![Payload::json(&(self.start + i * part, part))?];
                let request = SpawnRequest { kind: None, method: "sum".into(), input, monitor: true, link: false };
                out.yield_command(i, Command::Spawn(request));
            }
        }
        if self.exits == 10 {
            out.complete(Ok(Payload::json(&self.sum)?));
        } else {
            out.set_status(Status::Idle);
        }
        Ok(())
    }
}

/// Asks the embedder's `greet` command for a greeting and waits for one message; answers
/// with both once it has both, whichever arrives first.
#[derive(Default)]
struct Greeter {
    asked: bool,
    greeting: Option<String>,
    news: Option<String>,
}

impl Process for Greeter {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if !self.asked {
            self.asked = true;
            out.yield_command(1, Command::Custom { name: "greet".into(), payload: Payload::text("demo") });
        }
        for event in events {
            match event {
                Event::Completion { tag: 1, result } => {
                    let greeting = result.map_err(anyhow::Error::msg)?;
                    self.greeting = Some(greeting.as_str().unwrap_or_default().to_owned());
                }
                Event::Message { topic, body, .. } => {
                    self.news = Some(format!("got `{topic}`: {}", body.as_str().unwrap_or_default()));
                }
                _ => {}
            }
        }
        match (&self.greeting, &self.news) {
            (Some(greeting), Some(news)) => out.complete(Ok(Payload::text(format!("{greeting}; {news}")))),
            // Waiting for the greeting (a completion) or the news (a message): either wakes it.
            _ => out.set_status(Status::Blocked),
        }
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let scheduler = Scheduler::builder()
        .kind("tree", || Ok(Box::new(Tree::default()) as Box<dyn Process>))
        .handler("greet", |r: Request| {
            let name = r.payload().as_str().unwrap_or("stranger").to_owned();
            r.complete(Ok(Payload::text(format!("hello, {name}"))));
        })
        .build()?;

    let n = 100_000u64;
    let start = Instant::now();
    let tree = scheduler
        .handle()
        .spawn(Spawnable::kind("tree"), SpawnOptions::new("sum").input(vec![Payload::json(&(0, n))?]))?;
    let sum: u64 = tree.join().map_err(anyhow::Error::msg)?.parse_json()?;
    println!("sum of 0..{n} by a tree of {} processes: {sum} in {:.1?}", n + n / 9, start.elapsed());
    assert_eq!(sum, n * (n - 1) / 2);

    let options = wasmproc::scheduler::SpawnOptions::new("main").capabilities(Capabilities::default().allow("greet"));
    let greeter = scheduler.handle().spawn(Greeter::default(), options)?;
    scheduler.handle().send(greeter.pid(), "news", Payload::text("the scheduler works"))?;
    println!("greeter answered: {}", greeter.join().map_err(anyhow::Error::msg)?.as_str().unwrap_or(""));

    match scheduler.handle().spawn(Spawnable::kind("tree"), "product") {
        Err(e) => println!("a bad spawn is an error, not a crash: {e}"),
        Ok(_) => anyhow::bail!("unknown method accepted"),
    }

    let stats = scheduler.handle().stats();
    println!(
        "stats: {} spawned, {} completed, {} yields, {} messages, peak {} live",
        stats.spawned, stats.completed, stats.yields, stats.messages, stats.peak_live
    );
    for (i, w) in stats.workers.iter().enumerate() {
        println!("  worker {i}: {} steps, {} steals taking {} processes", w.executed, w.steals, w.stolen);
    }
    let report = scheduler.stop(Duration::from_secs(1));
    println!("stopped in {:.1?}", report.elapsed);
    Ok(())
}

/// `cargo test` runs the tour too (`test = true` in `Cargo.toml`): it checks its own
/// results, so a change that breaks it fails the suite, not only a reader of the README.
#[test]
fn the_tour_runs_to_the_end() -> anyhow::Result<()> {
    main()
}
