//! `wasmproc run`: spawns the entry process and waits for it and everything it spawned.
//!
//! The main thread waits on one channel for whichever comes first: the entry process's
//! result (from a joining thread), a signal (SIGINT, SIGTERM or SIGHUP, from the signal
//! thread) or the timeout (as the channel's deadline). Ending early is always graceful
//! first: every process gets a cancel event and `--grace` to end; what is left is then
//! terminated, at its next epoch tick whatever it is doing. A result the entry process
//! gave before the end is printed whatever ended the run.
//!
//! Nothing the run writes can hold it up (see `output.rs`), and nothing a step does can
//! hold up its end: a step blocked outside Wasm (a WASI program writing to a pipe nobody
//! reads) is left behind when the host exits.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use wasmproc::cluster::{RemoteSpawnOptions, RunLimits};
use wasmproc::error::SpawnError;
use wasmproc::handler::KindLimits;
use wasmproc::journal::{self, Journal, JournalSettings};
use wasmproc::scheduler::{ProcessHandle, Retry, RetryPolicy, Retrying, SpawnOptions};
use wasmproc::wasm::{COMMAND_ENTRY, InitRefused, LogRecord, Program, WasiOptions};
use wasmproc::{Capabilities, Payload, Scheduler, wasm};

use super::input::{payloads, read_app};
use super::inspect::declared::{self, Declared, GrantedBy};
use super::output::{Output, Say, style};
use super::providers::{FAMILIES, ProviderArgs, Providers, Services, dir_grants, env_vars};
use super::report::{CompileNotice, Ended, Progress, Report, Summary, for_stderr};
use super::resume;
use super::stop::Signals;
use super::supervise::{self, SuperviseArgs};
use super::{ClusterArgs, EngineArgs, Exit, Failure, Given, GrantArgs, LimitArgs, runtime, units};
use wasmproc::scheduler::Spawnable;
use wasmproc::supervisor;

/// `run --help`'s text after the flags: examples, and the sandbox's defaults from the
/// constants the flags default to.
pub(super) fn after_help() -> String {
    format!(
        "{EXAMPLES}\n\nSandbox defaults: {} of memory for each process, steps preempted every {}, no CPU or\n\
         fuel limit, no files, no environment, no network; the commands sleep, spawn, send,\n\
         monitor, unlink, demonitor and trap-exits are granted; terminate, exit and link are\n\
         granted over a process's own children only (--allow terminate, exit, link: over any).\n\n{PROVIDERS}",
        units::size_text(wasm::DEFAULT_MAX_MEMORY),
        units::duration_text(wasm::DEFAULT_TIME_SLICE),
    )
}

const EXAMPLES: &str = "\
Examples:
  wasmproc run app.wasm --method main --input '{\"n\": 10}'
  wasmproc run app.wasm --input-file job.json --timeout 30s --stats
  wasmproc run tool.wasm --dir ./data::/data -- --verbose input.txt   (a WASI command)
  wasmproc run flow.wasm --journal ./flow.journal   (durable: after a crash, the same
                                                    command resumes the run)
  wasmproc run --supervise tree.toml                (a supervision tree described in a file)
  wasmproc run server.wasm --restart transient --restart-intensity 3 --restart-period 10s

The result is printed on stdout (JSON as the process gave it); logs and guest output go
to stderr, tagged with the process id. A WASI command's own stdin/stdout/stderr are
passed through and its exit code becomes wasmproc's.";

const PROVIDERS: &str = "\
Providers (process components): http.* with --allow-host, kv.* with --kv, fs.* with --dir
and --dir-rw, env.* with --env, time.now and random.bytes always, NAME.* with --provider
NAME=FILE. A command whose flag is missing is denied, naming the flag.
  wasmproc run fetcher.wasm --allow-host 127.0.0.1:8080 --kv ./state \
      --input '{\"url\": \"http://127.0.0.1:8080/\"}'
  wasmproc run workflow.wasm --provider inventory=inventory.wasm \
      --input '{\"item\": \"apples\", \"quantity\": 2}'";

/// `wasmproc run`'s flags: the run to make, its flags in groups (each a heading of
/// `--help`), those other subcommands take too defined once in `args.rs`.
#[derive(Args, Debug)]
pub(super) struct Run {
    /// The program: a component of the wasmproc:process world, a WASI command
    /// (a wasi:cli/run component or a preview 1 module with _start), or a file made by
    /// `wasmproc compile`. Wasm, or its text format (a .wat file, or one starting with
    /// `(`).
    #[arg(value_name = "APP.wasm", required_unless_present = "supervise")]
    app: Option<PathBuf>,
    /// The entry method the first process starts in. [default: main; run for a WASI
    /// command]
    #[arg(long, short, value_name = "NAME")]
    method: Option<String>,
    /// An input payload, as JSON. Repeat for several; SDK entries take the first.
    #[arg(long = "input", short, value_name = "JSON")]
    inputs: Vec<String>,
    /// Read an input payload (JSON) from FILE, or from stdin with `-`. Comes after the
    /// --input payloads.
    #[arg(long, value_name = "FILE")]
    input_file: Option<PathBuf>,
    /// Worker threads. [default: one per core]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    workers: Option<u32>,
    /// Stop everything after DURATION (e.g. 30s, 5m): cancel every process, give them
    /// --grace to end, then terminate the rest. Exit code 4; a result the entry process
    /// gave before is printed all the same. [default: no limit]
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    timeout: Option<Duration>,
    /// How long a stopped run (--timeout, Ctrl-C, SIGTERM, SIGHUP) gives its processes to
    /// end once cancelled, before it terminates them.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = units::duration)]
    grace: Duration,
    /// WASI commands only: the program's arguments (after `--`); its argv[0] is the
    /// file name.
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
    /// The command line was the shorthand `wasmproc APP.wasm [ARGS...]`, whose words
    /// after the program became `args` without the user typing `--`.
    #[arg(long = "shorthand", hide = true)]
    shorthand: bool,
    #[command(flatten)]
    pub(super) limits: LimitArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    #[command(flatten)]
    grants: GrantArgs,
    #[command(flatten)]
    providers: ProviderArgs,
    #[command(flatten)]
    durable: JournalArgs,
    #[command(flatten)]
    supervision: SuperviseArgs,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Run the entry process on a cluster (`--cluster URL`: its NATS server) instead of
    /// here: on its least loaded node, and print its result as a local run does.
    #[command(flatten)]
    pub(super) cluster: ClusterArgs,
}

/// The sandbox each process of a run gets: its CPU, what one instantiation creates, and
/// the commands it may yield.
#[derive(Args, Debug)]
#[command(next_help_heading = "Sandbox")]
struct SandboxArgs {
    /// How long a step runs before it is preempted: suspended and queued behind the
    /// processes waiting, so a busy or looping process never holds a worker (a bare
    /// number is milliseconds). While others wait, a step yields sooner, at the next
    /// 1 ms tick. A WASI command's run is preempted the same way.
    #[arg(long, value_name = "DURATION", default_value = units::duration_text(wasm::DEFAULT_TIME_SLICE), value_parser = units::millis)]
    time_slice: Duration,
    /// A step past its time slice fails its process instead of being preempted. Steps
    /// are cheaper without preemption (see docs/perf/sandbox.md): for trusted guests only.
    #[arg(long)]
    no_preemption: bool,
    /// Total CPU time each process may use over its life (e.g. 2s); a process past it
    /// fails. Bounds a looping process, which preemption alone lets live.
    /// [default: unlimited]
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    cpu_budget: Option<Duration>,
    /// How long instantiating a process and its `init` may take. Instantiating a Python
    /// guest copies its interpreter's memory image (about 15 ms a process): raise this on a
    /// loaded machine if spawns fail with "init time limit exceeded".
    #[arg(long, value_name = "DURATION", default_value = units::duration_text(wasm::DEFAULT_INIT_TIME_LIMIT), value_parser = units::duration)]
    init_time_limit: Duration,
    /// The most core module instances one process may have (a componentize-py guest has
    /// 14, a Rust guest 3); a component that needs more fails to load, naming this flag.
    #[arg(long, value_name = "N", default_value_t = wasm::DEFAULT_MAX_CORE_INSTANCES)]
    max_core_instances: u32,
    /// The most tables one process may have, over all its core instances.
    #[arg(long, value_name = "N", default_value_t = wasm::DEFAULT_MAX_TABLES)]
    max_tables: u32,
    /// The most elements one table may have; a larger table, or growth past it, fails
    /// its process.
    #[arg(long, value_name = "N", default_value_t = wasm::DEFAULT_MAX_TABLE_ELEMENTS)]
    max_table_elements: u32,
    /// The most linear memories one process may have. Each takes a --memory slot of
    /// address space, reserved for every one of --max-processes.
    #[arg(long, value_name = "N", default_value_t = wasm::DEFAULT_MAX_MEMORIES,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_memories: u32,
    /// Grant a command to every process (repeatable). Granted by default: sleep, spawn,
    /// send, monitor, unlink, demonitor, trap-exits. Granted over a process's own
    /// children only, unless allowed: terminate, exit, link.
    #[arg(long = "allow", value_name = "COMMAND")]
    allow: Vec<String>,
    /// Withdraw a granted command (repeatable), e.g. --deny spawn.
    #[arg(long = "deny", value_name = "COMMAND")]
    deny: Vec<String>,
}

/// A durable run (`--journal`).
#[derive(Args, Debug)]
#[command(next_help_heading = "Journal")]
struct JournalArgs {
    /// Run durably, with the journal in DIR (created if missing): every step is recorded
    /// before it takes effect, so after a crash, a kill or a stop the same command
    /// resumes the run where it was instead of starting it again. Process components
    /// only.
    #[arg(long, value_name = "DIR")]
    journal: Option<PathBuf>,
    /// With --journal: keep the records of finished processes, for `wasmproc journal
    /// show` after the run (by default a run's records go once all its processes have
    /// ended).
    #[arg(long, requires = "journal")]
    keep_finished: bool,
    /// With --journal: when a group of steps counts as recorded, and may take effect.
    /// `sync` (the default): once synced to disk, so the run survives the machine going
    /// down. `buffered`: once handed to the operating system, so the run survives
    /// wasmproc being killed but not the machine going down, and commits wait for no disk.
    #[arg(long, value_enum, value_name = "WHEN", requires = "journal")]
    durability: Option<Durability>,
    /// With --journal: the most records one process may have in the journal (its spawn,
    /// one a step, its exit); a step past it ends the process with `journal limit
    /// reached`. Bounds the journal of a workflow that never ends. At least 2.
    #[arg(
        long,
        value_name = "RECORDS",
        default_value_t = JournalSettings::default().max_records_per_process,
        requires = "journal",
        value_parser = clap::value_parser!(u64).range(2..)
    )]
    journal_limit: u64,
    /// With --journal: when the run resumes, print the guest log lines of the steps
    /// replayed from the journal too, marked `(replayed)`. By default only the lines of
    /// steps that run anew are printed: the replayed ones were printed when they first ran.
    #[arg(long, requires = "journal")]
    replayed_logs: bool,
    /// With --journal: how long a process may wait (for a timer, a message, a child)
    /// before it leaves memory altogether: only its entry in the scheduler stays, and its
    /// next event brings it back, replayed from the journal. `never` (or 0) keeps every
    /// waiting process in memory. --stats counts the suspended ones.
    #[arg(long, value_name = "DURATION", default_value = units::duration_text(wasmproc::scheduler::DEFAULT_SUSPEND_AFTER), value_parser = units::threshold, requires = "journal")]
    suspend_after: units::Threshold,
    /// With --journal: every N steps of a process, write its snapshot to the journal in
    /// place of its records before it, so that a resume starts from the snapshot and the
    /// journal of a workflow that steps for ever stays bounded (at about N records a
    /// process). A process whose component cannot be captured whole keeps its records.
    /// Off by default.
    #[arg(long, value_name = "N", requires = "journal", value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every: Option<u64>,
}

/// What a run prints beside its result.
#[derive(Args, Debug)]
#[command(next_help_heading = "Output")]
struct OutputArgs {
    /// Print a summary at exit (stderr, or in the --json object): processes, steps,
    /// yields by command, messages, steals, per-worker steps, peak live, what the journal
    /// wrote (with --journal), wall time.
    #[arg(long)]
    stats: bool,
    /// Show a live status line on stderr while compiling and running (only when stderr is
    /// a terminal, and not with --log-format json), erased before any other line; for a
    /// WASI command, which writes to the terminal itself, only while compiling.
    #[arg(long)]
    progress: bool,
    /// Print one JSON object on stdout: {"ok": RESULT} or {"error": MESSAGE}, with "stats"
    /// when --stats is given. Process components only: a WASI command's stdout is the
    /// program's own, which an object must not be mixed into, so --json is refused for one
    /// (its exit code is wasmproc's; --stats prints on stderr).
    #[arg(long)]
    json: bool,
}

/// The hidden flag the shorthand `wasmproc APP.wasm [ARGS...]` expands with.
pub(super) const SHORTHAND_FLAG: &str = "--shorthand";

/// The entry process, ready to spawn.
enum Root {
    Process {
        method: String,
        inputs: Vec<Payload>,
    },
    Command(Box<wasmproc::wasm::WasiProcess>),
    /// The built-in supervisor (`--supervise`, `--restart`), with its spec.
    Supervised(SpawnOptions),
    /// Resumed from the journal: already running.
    Resumed(ProcessHandle),
    /// The journal's run had finished before it was reported: its recorded result.
    Finished(Ended),
}

/// A run ready to start: its scheduler, its entry process, the provider components'
/// scheduler, and its journal.
struct Prepared {
    scheduler: Scheduler,
    /// The runtime of the run's components: what hibernation did (`--stats`).
    runtime: wasm::Runtime,
    root: Root,
    services: Option<Services>,
    journal: Option<Journal>,
}

/// When a durable run's steps count as recorded (`--durability`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
enum Durability {
    /// Synced to disk: survives the machine going down.
    #[default]
    Sync,
    /// Handed to the operating system: survives wasmproc being killed, not the machine
    /// going down.
    Buffered,
}

impl Run {
    /// Loads the program, spawns its entry process, waits for it and everything it
    /// spawned (or for what stops the run first), and reports.
    pub(super) fn execute(self, given: Given<'_>) -> Result<ExitCode, Failure> {
        let start = Instant::now();
        let out = Output::start();
        if self.cluster.url.is_some() {
            super::on_cluster::refuse_here_only(given, &Run::augment_args(clap::Command::new("run")))?;
        }
        let signals = Signals::listen()?;
        self.limits.check()?;
        self.refuse_with_supervision(given)?;
        let inputs = payloads(&self.inputs, self.input_file.as_deref(), self.limits.max_payload)?;
        if self.cluster.url.is_some() {
            let method = self.method.as_deref().unwrap_or("main");
            let options = SpawnOptions::new(method).input(inputs).capabilities(capabilities(&self, &[])?);
            let run = super::on_cluster::ClusterRun {
                cluster: &self.cluster,
                app: self.app(),
                options: RemoteSpawnOptions::new(options).limits(self.kind_limits()).run_limits(self.run_limits(given)),
                max_module_size: self.engine.max_module_size,
                timeout: self.timeout,
                grace: self.grace,
                json: self.output.json,
                stats: self.output.stats,
            };
            return super::on_cluster::run_on_cluster(run, &out, &signals, start);
        }
        let interrupt = Arc::new(AtomicBool::new(false));
        let retry = self.supervision.retry(self.durable.journal.is_some());
        // A deadline past what `Instant` holds is no deadline.
        let deadline = self.timeout.and_then(|timeout| start.checked_add(timeout));
        let mut prepared = self.prepare(inputs.clone(), &out, &interrupt, retry.as_ref())?;
        signals.started();
        loop {
            let Prepared { scheduler, runtime, root, services, journal } = prepared;
            let is_command = matches!(root, Root::Command(_));
            let report = Report::new(self.output.json, &out, is_command);
            if let Root::Finished(result) = root {
                scheduler.stop(Duration::ZERO);
                let code = report.finish(Some(result), None, None);
                self.forget_finished(journal.as_ref(), &out);
                return Ok(code);
            }
            let process = match root.spawn(&scheduler) {
                Ok(process) => process,
                Err(e) => {
                    scheduler.stop(Duration::ZERO);
                    if let Some(refused) = input_refused(&e) {
                        return Err(refused);
                    }
                    let ended = Ended::not_started(format!("the process could not start: {e}"));
                    return Ok(report.finish(Some(ended), None, None));
                }
            };
            signals.forward_end_of(process);
            // A WASI command writes to the terminal itself, where no line of ours can be
            // erased before its output.
            let progress = (self.live_progress() && !is_command).then(|| Progress::start(&scheduler, &out, start));
            let (root, stop) = match &retry {
                None => signals.wait(&scheduler, deadline, self.timeout, &out),
                Some(retry) => match signals.wait_for_entry(deadline, self.timeout) {
                    Err(stop) => (None, Some(stop)),
                    Ok(ended) => match retry.take() {
                        None => (Some(ended), signals.wait_for_rest(&scheduler, deadline, self.timeout, &out).err()),
                        Some(retrying) => {
                            // Suspended as a crash at the trap would leave it: the next
                            // scheduler on the journal resumes the run.
                            scheduler.stop(Duration::ZERO);
                            drop((scheduler, journal));
                            if let Some(services) = services {
                                services.stop(self.grace);
                            }
                            if let Some(progress) = progress {
                                progress.finish();
                            }
                            out.say(Say::Notice, retrying_notice(&retrying, &retry.policy()));
                            if let Err(stop) = signals.pause(retrying.delay, deadline, self.timeout) {
                                out.say(
                                    Say::Notice,
                                    format!(
                                        "{}: the run is suspended; run the same command again to resume",
                                        stop.reason()
                                    ),
                                );
                                return Ok(report.finish(None, Some(stop), None));
                            }
                            prepared = self.prepare(inputs.clone(), &out, &interrupt, Some(retry))?;
                            continue;
                        }
                    },
                },
            };
            let root = match stop {
                Some(stop) => {
                    interrupt.store(true, Ordering::Relaxed);
                    signals.stop_gracefully(&scheduler, stop, self.grace, &out, root)
                }
                None => root,
            };
            let stats = scheduler.handle().stats();
            let journal_stats = scheduler.handle().journal_stats();
            super::stop::shut_down(scheduler, stop.is_some(), &out);
            if let Some(services) = services {
                services.stop(self.grace);
            }
            if let Some(progress) = progress {
                progress.finish();
            }
            // A stopped run's processes failed because it was stopped: no news.
            let report = if stop.is_none() { report.with_unobserved(&stats) } else { report };
            let summary = self.output.stats.then(|| {
                Summary::new(stats, start.elapsed(), out.dropped())
                    .with_journal(journal_stats)
                    .with_hibernation(runtime.hibernation_stats())
            });
            let flush_by = stop.map(|_| Instant::now() + super::stop::FLUSH_AFTER_STOP).or(deadline);
            let code = report.with_summary(summary).finish(root, stop, flush_by);
            self.forget_finished(journal.as_ref(), &out);
            return Ok(code);
        }
    }

    /// Removes the journal's finished runs once their results are reported (unless
    /// --keep-finished): a host that dies before this finds the result on its next start
    /// and reports it again rather than running the workflow again.
    fn forget_finished(&self, journal: Option<&Journal>, out: &Output) {
        let Some(journal) = journal.filter(|_| !self.durable.keep_finished) else { return };
        let forgotten = journal.finished_runs().and_then(|runs| runs.iter().try_for_each(|run| journal.forget(run)));
        if let Err(error) = forgotten {
            out.say(
                Say::Warning,
                format!(
                    "the finished run's records stay in the journal ({error}): the next run with it reports \
                 its result again"
                ),
            );
        }
    }

    /// Reads and loads the program, and builds the scheduler that runs it, with the
    /// entry process to spawn on it.
    fn prepare(
        &self,
        inputs: Vec<Payload>,
        out: &Output,
        interrupt: &Arc<AtomicBool>,
        retry: Option<&Retry>,
    ) -> Result<Prepared, Failure> {
        let served: Vec<String> = self
            .providers
            .providers
            .iter()
            .filter_map(|spec| spec.split_once('=').map(|(name, _)| name.to_owned()))
            .collect();
        let caps = capabilities(self, &served)?;
        let bytes = match &self.supervision.supervise {
            Some(_) => Vec::new(),
            None => read_app(self.app(), self.engine.max_module_size as u64)?,
        };
        let mut ungranted = None;
        let guest_out = out.clone();
        let replayed_logs = self.durable.replayed_logs;
        let mut config = self
            .limits
            .runtime(self.engine.config()?)
            .time_slice(self.sandbox.time_slice)
            .preemption(!self.sandbox.no_preemption)
            .init_time_limit(self.sandbox.init_time_limit)
            .max_core_instances(self.sandbox.max_core_instances)
            .max_tables(self.sandbox.max_tables)
            .max_table_elements(self.sandbox.max_table_elements)
            .max_memories(self.sandbox.max_memories)
            .log_sink(move |record: &LogRecord<'_>| {
                if replayed_logs || !record.replayed {
                    guest_out.guest_line(record);
                }
            });
        if let Some(budget) = self.sandbox.cpu_budget {
            config = config.cpu_budget(budget);
        }
        let runtime = runtime(config)?;
        if let Some(file) = &self.supervision.supervise {
            return self.prepare_supervised(file, &runtime, caps, out);
        }
        runtime.name_source(&bytes, self.app());
        let loading = Instant::now();
        let notice = (!style().quiet && runtime.would_compile(&bytes))
            .then(|| CompileNotice::start(self.app(), !self.engine.no_cache, self.live_progress(), out));
        let program = runtime.load_program_bytes(&bytes);
        if let Some(notice) = notice {
            notice.finish();
        }
        let program = program
            .map_err(|e| Failure::new(Exit::BadModule, format!("cannot load `{}`: {e:#}", self.app().display())))?;
        tracing::debug!(app = %self.app().display(), elapsed = ?loading.elapsed(), "loaded the program");
        let mut builder = self.limits.scheduler(Scheduler::builder());
        if let Some(workers) = self.workers {
            builder = builder.workers(workers as usize);
        }
        let mut services = None;
        let mut journal = None;
        // What a resumed run's command line withdraws from its recorded grants, or asks
        // for beyond them: said once it resumes.
        let mut narrowed = None;
        let root = match program {
            Program::Process(component) => {
                let method = self.entry_method(component.entries())?;
                ungranted = self.ungranted(&bytes, &method, &caps, &served);
                (builder, services) = self.serve(builder, &runtime, &caps)?;
                let identity = component.hash();
                builder = builder.kind("app", component);
                let asked = resume::Asked { app: self.app(), identity: &identity, method: &method, input: &inputs };
                (builder, journal, narrowed) = self.open_journal(builder, &caps, &asked)?;
                if let Some(retry) = retry {
                    builder = builder.retry(retry.clone());
                }
                let id = self.app().file_stem().map_or_else(|| "app".to_owned(), |s| s.to_string_lossy().into_owned());
                // A durable run's --restart retries the process in place (`retry`).
                let supervised = if journal.is_some() {
                    None
                } else {
                    self.supervision.restart_options(&id, "app", &method, &inputs)?
                };
                match supervised {
                    Some(options) => Root::Supervised(options),
                    None => Root::Process { method, inputs },
                }
            }
            Program::Wasi(command) => {
                if self.supervision.supervised() {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!(
                            "`{}` is a WASI command: {} supervises process components (drop it)",
                            self.app().display(),
                            self.supervision.flag()
                        ),
                    ));
                }
                if self.durable.journal.is_some() {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!(
                            "`{}` is a WASI command: it runs in one step, so --journal cannot make it durable",
                            self.app().display()
                        ),
                    ));
                }
                self.check_command_flags(&inputs)?;
                builder = builder.capabilities(caps);
                Root::Command(Box::new(command.process(command_options(self, interrupt.clone())?)))
            }
        };
        let scheduler =
            builder.build().map_err(|e| Failure::new(Exit::Host, format!("cannot start the scheduler: {e:#}")))?;
        let root = self.resumed_root(&scheduler, root, journal.as_ref(), narrowed, out)?;
        // Said once the command line has passed every check, so that a usage error is
        // the one thing a wrong command line shows.
        if let Some(warning) = ungranted {
            out.say(Say::Warning, warning);
        }
        Ok(Prepared { scheduler, runtime, root, services, journal })
    }

    /// With --journal: opens the journal on `builder`, after checking that the run it
    /// holds is the one `asked` for; with the notice of the grants a resume narrows.
    fn open_journal(
        &self,
        builder: wasmproc::scheduler::Builder,
        caps: &Capabilities,
        asked: &resume::Asked<'_>,
    ) -> Result<(wasmproc::scheduler::Builder, Option<Journal>, Option<String>), Failure> {
        let Some(dir) = &self.durable.journal else { return Ok((builder, None, None)) };
        // The host keeps finished runs; the run removes them once it has reported their
        // results (`forget_finished`).
        let mut settings = JournalSettings::default();
        settings.keep_finished = true;
        settings.durability = match self.durable.durability.unwrap_or_default() {
            Durability::Sync => journal::Durability::Sync,
            Durability::Buffered => journal::Durability::Buffered,
        };
        settings.max_records_per_process = self.durable.journal_limit;
        let opened = Journal::open(dir).map_err(|e| Failure::new(Exit::Host, format!("{e}")))?;
        let opened = opened.settings(settings);
        let held = opened
            .runs()
            .map_err(|e| Failure::new(Exit::Host, format!("cannot read the journal in `{}`: {e}", dir.display())))?;
        resume::check(dir, &held, asked)?;
        let mut builder = builder;
        let mut narrowed = None;
        if let Some(run) = held.iter().find(|run| run.result.is_none()) {
            narrowed = resume::narrowing(&run.caps, caps);
            let recorded = run.caps.clone();
            builder = builder.denial_hint(move |name| resume::denial_hint(&recorded, name));
        }
        let builder = builder
            .journal(opened.clone())
            .resume_within(caps.clone())
            .suspend_after(self.durable.suspend_after.0)
            .snapshot_every(self.durable.snapshot_every);
        Ok((builder, Some(opened), narrowed))
    }

    /// The run's entry process: the one `scheduler` resumed from the journal, or the
    /// result of the journal's finished run, or else `root`, to spawn.
    fn resumed_root(
        &self,
        scheduler: &Scheduler,
        root: Root,
        journal: Option<&Journal>,
        narrowed: Option<String>,
        out: &Output,
    ) -> Result<Root, Failure> {
        let mut resumed = scheduler.resumed();
        match resumed.len() {
            0 => Ok(self.finished_run(journal, out).map_or(root, Root::Finished)),
            1 => {
                let process = resumed.remove(0);
                if let Some(dir) = &self.durable.journal {
                    out.say(
                        Say::Notice,
                        format!("resuming process {} from the journal in {}", process.pid(), dir.display()),
                    );
                }
                if let Some(narrowed) = narrowed {
                    out.say(Say::Notice, narrowed);
                }
                Ok(Root::Resumed(process))
            }
            n => {
                scheduler.stop(Duration::ZERO);
                Err(Failure::new(
                    Exit::Usage,
                    format!("the journal holds {n} unfinished runs; one journal directory serves one run at a time"),
                ))
            }
        }
    }

    /// The program: given unless `--supervise` is (clap holds it so), and read only then.
    fn app(&self) -> &Path {
        self.app.as_deref().expect("APP.wasm is required unless --supervise is given")
    }

    /// Refuses the flags that do not go with `--supervise` or `--restart`, saying why.
    fn refuse_with_supervision(&self, given: Given<'_>) -> Result<(), Failure> {
        let refuse = |message: String| Err(Failure::new(Exit::Usage, message));
        if self.supervision.supervise.is_some() {
            let file = "the file names each child's component, method and input";
            if let Some(app) = &self.app {
                return refuse(format!(
                    "--supervise runs the supervision tree its file describes, and {file}: drop `{}` (make it a \
                     child's `kind` in the spec)",
                    app.display()
                ));
            }
            for (id, flag) in [("method", "--method"), ("inputs", "--input"), ("input_file", "--input-file")] {
                if given.has(id) {
                    return refuse(format!("{flag} with --supervise: {file}; drop {flag}"));
                }
            }
            if self.supervision.restart.is_some() {
                return refuse(
                    "--restart with --supervise: --restart puts one entry process under a supervisor, and the \
                     file's spec says how each child restarts; drop --restart"
                        .to_owned(),
                );
            }
        }
        if self.supervision.restart == Some(supervise::RestartPolicy::Permanent) && self.durable.journal.is_some() {
            return refuse(
                "--restart permanent with --journal: a durable process that ends has finished its run, and is not \
                 started again; --restart transient retries its traps from its last journaled step"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// The scheduler of `--supervise FILE`, with each component the spec's children name
    /// registered as a kind under the name the spec gives it, and its supervisor to
    /// spawn as the entry process.
    fn prepare_supervised(
        &self,
        file: &Path,
        runtime: &wasm::Runtime,
        caps: Capabilities,
        out: &Output,
    ) -> Result<Prepared, Failure> {
        let spec = supervise::read_spec(file, self.limits.max_payload as u64)?;
        let base = file.parent().unwrap_or(Path::new("."));
        let mut builder = self.limits.scheduler(Scheduler::builder());
        if let Some(workers) = self.workers {
            builder = builder.workers(workers as usize);
        }
        for (kind, path) in supervise::components(&spec, base) {
            let bytes = read_app(&path, self.engine.max_module_size as u64).map_err(|failure| {
                Failure::new(
                    failure.exit,
                    format!("the child kind `{kind}` of `{}`: {}", file.display(), failure.message),
                )
            })?;
            runtime.name_source(&bytes, &path);
            let notice = (!style().quiet && runtime.would_compile(&bytes))
                .then(|| CompileNotice::start(&path, !self.engine.no_cache, self.live_progress(), out));
            let program = runtime.load_program_bytes(&bytes);
            if let Some(notice) = notice {
                notice.finish();
            }
            match program {
                Ok(Program::Process(component)) => builder = builder.kind(kind, component),
                Ok(Program::Wasi(_)) => {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!(
                            "`{}` (the child kind `{kind}`) is a WASI command; a supervisor's children are process \
                             components",
                            path.display()
                        ),
                    ));
                }
                Err(e) => {
                    return Err(Failure::new(Exit::BadModule, format!("cannot load `{}`: {e:#}", path.display())));
                }
            }
        }
        let (builder, services) = self.serve(builder, runtime, &caps)?;
        let refused =
            |e: anyhow::Error| Failure::new(Exit::Usage, format!("the supervisor spec `{}`: {e:#}", file.display()));
        let options = spec.spawn_options().map_err(refused)?;
        let input = [Payload::json(&spec).map_err(|e| refused(e.into()))?];
        // The supervisor's kind is built in: its spec, its input, says what it runs, and
        // the children's kinds are checked against their components on resume.
        let asked = resume::Asked { app: file, identity: "", method: supervisor::START, input: &input };
        let (builder, journal, narrowed) = self.open_journal(builder, &caps, &asked)?;
        let scheduler =
            builder.build().map_err(|e| Failure::new(Exit::Host, format!("cannot start the scheduler: {e:#}")))?;
        let root = self.resumed_root(&scheduler, Root::Supervised(options), journal.as_ref(), narrowed, out)?;
        Ok(Prepared { scheduler, runtime: runtime.clone(), root, services, journal })
    }

    /// Starts the run's providers and provider components and registers them on
    /// `builder`, with the grants `caps`: what every process of the run is served.
    fn serve(
        &self,
        builder: wasmproc::scheduler::Builder,
        runtime: &wasm::Runtime,
        caps: &Capabilities,
    ) -> Result<(wasmproc::scheduler::Builder, Option<Services>), Failure> {
        let providers = Providers::start(
            &self.providers,
            dir_grants(&self.grants.dir, &self.grants.dir_rw)?,
            env_vars(&self.grants.env)?,
        )?;
        let services = Services::start(
            &self.providers.providers,
            &self.providers.reads,
            runtime,
            &providers,
            caps,
            self.engine.max_module_size as u64,
        )?;
        let mut builder = providers
            .register(builder.capabilities(caps.clone()))
            .denial_hint(|name| format!("grant it with --allow {name}"));
        if let Some(services) = &services {
            builder = services.register(builder);
        }
        Ok((builder, services))
    }

    /// The result of a run the journal holds finished but unreported (the host died
    /// between the two), to report instead of running again.
    fn finished_run(&self, journal: Option<&Journal>, out: &Output) -> Option<Ended> {
        let runs = journal?.finished_runs().ok()?;
        let run = runs.into_iter().next()?;
        out.say(
            Say::Notice,
            format!(
                "the run in {} had finished (process {}); its result, from the journal",
                self.durable.journal.as_ref()?.display(),
                run.root
            ),
        );
        Some(Ended::of(run.root, run.result))
    }

    /// The warning, given before the run starts, of the commands the component declares
    /// its entry method `method` yields (the SDK's `uses!`) that this run does not grant,
    /// grouped by the flag that would: such a run fails at its first use of one, and this
    /// says why up front.
    fn ungranted(&self, bytes: &[u8], method: &str, caps: &Capabilities, served: &[String]) -> Option<String> {
        let declared = Declared::read(bytes);
        let mut by_grant: Vec<(String, Vec<String>)> = Vec::new();
        for command in declared.of_entry(method).into_iter().filter(|command| !self.grants(command, caps, served)) {
            let grant = declared::grant(command);
            match by_grant.iter_mut().find(|(g, _)| *g == grant) {
                Some((_, names)) => names.push(format!("`{command}`")),
                None => by_grant.push((grant, vec![format!("`{command}`")])),
            }
        }
        if by_grant.is_empty() {
            return None;
        }
        let missing: Vec<String> =
            by_grant.into_iter().map(|(grant, names)| format!("{} ({grant})", names.join(", "))).collect();
        Some(format!(
            "`{}` declares commands this run does not grant to `{method}`: {}",
            self.app().display(),
            missing.join("; ")
        ))
    }

    /// Whether this run lets a process yield `command` (a name, or a family as `kv.*`):
    /// granted, and served (a provider family's flag given, or a `--provider`).
    fn grants(&self, command: &str, caps: &Capabilities, served: &[String]) -> bool {
        let dirs = !self.grants.dir.is_empty() || !self.grants.dir_rw.is_empty();
        caps.allows(command)
            && match GrantedBy::of(command) {
                GrantedBy::Default | GrantedBy::AllowTerminate | GrantedBy::Embedders => true,
                GrantedBy::AllowHost => !self.providers.allow_host.is_empty(),
                GrantedBy::Kv => self.providers.kv.is_some(),
                GrantedBy::Dir | GrantedBy::DirEither => dirs,
                GrantedBy::DirRw => !self.grants.dir_rw.is_empty(),
                GrantedBy::Env => !self.grants.env.is_empty(),
                GrantedBy::Provider(family) => served.iter().any(|name| name == family),
            }
    }

    /// The scheduler limits given on the command line (--max-children, --max-yields,
    /// --max-payload, --max-step-output, --mailbox, --mailbox-bytes, --max-links,
    /// --max-processes): what a run on a cluster carries to the nodes that run its
    /// processes, each clamped there to the node's own (--max-processes bounds the run's
    /// processes on each node, counted by each node apart). A flag left at its default
    /// leaves the node's own.
    fn run_limits(&self, given: Given<'_>) -> RunLimits {
        let mut limits = RunLimits::new();
        if given.has("max_children") {
            limits = limits.max_children(self.limits.max_children);
        }
        if given.has("max_yields") {
            limits = limits.max_yields_per_step(self.limits.max_yields);
        }
        if given.has("max_payload") {
            limits = limits.max_payload_size(self.limits.max_payload);
        }
        if let Some(bytes) = self.limits.max_step_output {
            limits = limits.max_output_per_step(bytes);
        }
        if given.has("mailbox") {
            limits = limits.mailbox_capacity(self.limits.mailbox);
        }
        if given.has("mailbox_bytes") {
            limits = limits.mailbox_bytes(self.limits.mailbox_bytes);
        }
        if given.has("max_links") {
            limits = limits.max_links(self.limits.max_links);
        }
        if given.has("max_processes") {
            limits = limits.max_processes(self.limits.max_processes as usize);
        }
        limits
    }

    /// The sandbox limits this run gives each process (--memory, --time-slice, --fuel,
    /// --cpu-budget): what its entry process runs under on another node with --cluster,
    /// and, through it, everything that process spawns.
    fn kind_limits(&self) -> KindLimits {
        let mut limits = KindLimits::new(self.engine.memory, self.sandbox.time_slice);
        if let Some(fuel) = self.engine.fuel {
            limits = limits.fuel(fuel);
        }
        if let Some(budget) = self.sandbox.cpu_budget {
            limits = limits.cpu_budget(budget);
        }
        limits
    }

    /// Whether `--progress` draws its live lines: they redraw themselves in place, so
    /// only on a terminal, and never between the JSON lines of `--log-format json`.
    fn live_progress(&self) -> bool {
        self.output.progress && !style().json && std::io::stderr().is_terminal()
    }

    /// The entry method of a process component: `--method`, else `main`, which must be
    /// one of its `entries`.
    fn entry_method(&self, entries: &[String]) -> Result<String, Failure> {
        refuse_command_flags(self)?;
        let method = self.method.clone().unwrap_or_else(|| "main".to_owned());
        if !entries.contains(&method) {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "`{}` has no entry method `{method}`: pass --method with one of: {}",
                    self.app().display(),
                    entries.join(", ")
                ),
            ));
        }
        Ok(method)
    }

    /// Refuses what a WASI command does not take: an entry method other than `run`, and
    /// input payloads.
    fn check_command_flags(&self, inputs: &[Payload]) -> Result<(), Failure> {
        if let Some(method) = self.method.as_ref().filter(|m| *m != COMMAND_ENTRY) {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "`{}` is a WASI command: it has no entry method `{method}` (drop --method)",
                    self.app().display()
                ),
            ));
        }
        if !inputs.is_empty() {
            return Err(Failure::new(
                Exit::Usage,
                "a WASI command takes no --input: pass its arguments after `--`".to_owned(),
            ));
        }
        if self.output.json {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "`{}` is a WASI command, whose stdout is its own output: --json would mix an object into it; \
                     drop --json (the program's exit code is wasmproc's, and --stats prints on stderr)",
                    self.app().display()
                ),
            ));
        }
        if let Some(flag) = self.providers.given() {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "{flag} gives process components a provider; `{}` is a WASI command, which reaches the outside \
                     through --dir and --env only",
                    self.app().display()
                ),
            ));
        }
        Ok(())
    }
}

impl Root {
    fn spawn(self, scheduler: &Scheduler) -> Result<ProcessHandle, wasmproc::error::SpawnError> {
        match self {
            Root::Process { method, inputs } => {
                scheduler.handle().spawn(Spawnable::kind("app"), SpawnOptions::new(&method).input(inputs))
            }
            Root::Supervised(options) => scheduler.handle().spawn(Spawnable::kind(supervisor::KIND), options),
            Root::Resumed(process) => Ok(process),
            Root::Finished(_) => unreachable!("a finished run is reported, not spawned"),
            Root::Command(process) => {
                scheduler.handle().spawn(process as Box<dyn wasmproc::Process>, SpawnOptions::new(COMMAND_ENTRY))
            }
        }
    }
}

/// The grant set: the CLI's defaults (the built-ins but those over other processes,
/// [`Capabilities::OVER_OTHERS`], and every provider family of the run, `served` among
/// them), then --allow, then --deny.
fn capabilities(args: &Run, served: &[String]) -> Result<Capabilities, Failure> {
    let families = || FAMILIES.iter().copied().chain(served.iter().map(String::as_str));
    let mut caps = families().fold(Capabilities::over_self(), |caps, family| caps.allow(&format!("{family}.*")));
    for (flag, names) in [("--allow", &args.sandbox.allow), ("--deny", &args.sandbox.deny)] {
        for name in names {
            let known = Capabilities::BUILTIN.contains(&name.as_str())
                || name
                    .split_once('.')
                    .is_some_and(|(family, rest)| !rest.is_empty() && families().any(|f| f == family));
            if !known {
                let list = families().map(|f| format!("{f}.*")).collect::<Vec<_>>().join(", ");
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "{flag} `{name}`: no such command; the commands are {} and the provider families {list} \
                         (a family's commands one by one, e.g. kv.get, or all as kv.*)",
                        Capabilities::BUILTIN.join(", ")
                    ),
                ));
            }
            caps = if flag == "--allow" { caps.allow(name) } else { caps.deny(name) };
        }
    }
    Ok(caps)
}

/// The usage error of an entry process whose `init` refused its input (the SDK's when
/// the JSON does not decode into the entry's argument): the command line gave input of
/// the wrong shape.
fn input_refused(error: &SpawnError) -> Option<Failure> {
    let SpawnError::Init { method, source } = error else { return None };
    let refused = source.downcast_ref::<InitRefused>()?;
    Some(Failure::new(
        Exit::Usage,
        format!(
            "the entry method `{method}` refused its input ({}): pass input of the shape it takes",
            for_stderr(&refused.0)
        ),
    ))
}

/// Refuses the flags that only WASI commands take.
fn refuse_command_flags(args: &Run) -> Result<(), Failure> {
    if args.args.is_empty() {
        return Ok(());
    }
    let app = args.app().display();
    if args.shorthand {
        // Flags are `run`'s, written after the program; a bare word is the input the
        // user meant to give.
        let words: Vec<String> = match args.args.as_slice() {
            [first, ..] if first.starts_with('-') => args.args.iter().map(|arg| shell_word(arg)).collect(),
            [input] if serde_json::from_str::<serde::de::IgnoredAny>(input).is_ok() => {
                vec!["--input".to_owned(), shell_word(input)]
            }
            // Not JSON: as a JSON string.
            [input] => vec!["--input".to_owned(), shell_word(&serde_json::Value::from(input.as_str()).to_string())],
            _ => vec!["--input".to_owned(), "JSON".to_owned()],
        };
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "`{app}` is a process component, so it takes no program arguments: `wasmproc APP.wasm ARGS...` \
                 passes ARGS to a WASI command; for a process component write `wasmproc run {} {}`",
                shell_word(&app.to_string()),
                words.join(" ")
            ),
        ));
    }
    Err(Failure::new(
        Exit::Usage,
        format!(
            "arguments after `--` applies to WASI commands only; `{app}` is a process component: give it input \
             with --input"
        ),
    ))
}

/// `word` as a shell reads it back: as it is if it holds nothing a shell treats
/// specially, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain { word.to_owned() } else { format!("'{}'", word.replace('\'', r"'\''")) }
}

/// The notice of a retry: what the process trapped with, and when and how often it is
/// retried.
fn retrying_notice(retrying: &Retrying, policy: &RetryPolicy) -> String {
    format!(
        "process {} {}: retrying it from its last journaled step in {} (retry {} of at most {} within {})",
        retrying.pid,
        retrying.reason,
        units::duration_text(retrying.delay),
        retrying.attempt,
        policy.intensity,
        units::duration_text(policy.period),
    )
}

fn command_options(args: &Run, interrupt: Arc<AtomicBool>) -> Result<WasiOptions, Failure> {
    let name = args.app().file_name().map_or_else(|| "app".to_owned(), |n| n.to_string_lossy().into_owned());
    let mut options = WasiOptions::new()
        .args(std::iter::once(name).chain(args.args.iter().cloned()))
        .inherit_stdio()
        .interrupt(interrupt);
    if let Some(timeout) = args.timeout {
        options = options.time_limit(timeout);
    }
    for grant in dir_grants(&args.grants.dir, &args.grants.dir_rw)? {
        options = options.dir(grant.host, &grant.guest, grant.writable);
    }
    for (name, value) in env_vars(&args.grants.env)? {
        options = options.env(name, value);
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use clap::{Args as _, Command};

    use super::super::on_cluster::{HERE_ONLY, ON_CLUSTER};
    use super::*;

    /// Each flag of `run` either works with `--cluster` or is refused with it, naming
    /// it: none is taken and then ignored, a new flag included (it fails this test until
    /// it is put in one of the two lists).
    #[test]
    fn every_run_flag_works_on_a_cluster_or_is_refused() {
        let run = Run::augment_args(Command::new("run"));
        let cluster = ClusterArgs::augment_args(Command::new("cluster"));
        let cluster_ids: Vec<&str> = cluster.get_arguments().map(|a| a.get_id().as_str()).collect();
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            let refused = HERE_ONLY.iter().any(|(here, _)| *here == id);
            let works = ON_CLUSTER.contains(&id) || cluster_ids.contains(&id);
            assert!(
                refused != works,
                "`{id}` of `run` is {} with --cluster",
                if works { "both allowed and refused" } else { "neither allowed nor refused" }
            );
        }
        for id in HERE_ONLY.iter().map(|(id, _)| *id).chain(ON_CLUSTER.iter().copied()) {
            assert!(run.get_arguments().any(|a| a.get_id() == id), "`run` has no flag `{id}`");
        }
    }
}
