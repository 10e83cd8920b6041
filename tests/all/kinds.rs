//! Kinds a `KindSource` resolves when they are asked for: by the embedder, by a process
//! (in the spawner's scope), and again when a durable scheduler resumes; and spawns the
//! embedder admits before they are journaled.

use std::sync::Arc;
use std::time::Duration;

use wasmproc::error::SpawnError;
use wasmproc::handler::{Factory, KindSource};
use wasmproc::journal::{Journal, MemoryStore};
use wasmproc::scheduler::Spawnable;
use wasmproc::{
    Command, Event, Events, ExitReason, Payload, Port, Process, Scheduler, SpawnRequest, Status, StepOutput,
};
use wasmproc_tests::HANG;

/// Resolves `TENANT/NAME` for any tenant, and a bare `NAME` to the spawner's tenant's:
/// kinds `app` and `worker` exist in every tenant.
struct Tenants;

impl KindSource for Tenants {
    fn resolve(&self, name: &str, spawner: Option<&str>) -> Option<(Arc<str>, Arc<dyn Factory>)> {
        let qualified = match name.split_once('/') {
            Some(_) => name.to_owned(),
            None => format!("{}/{name}", spawner?.split_once('/')?.0),
        };
        let (tenant, kind) = qualified.split_once('/')?;
        let tenant = tenant.to_owned();
        let factory: Arc<dyn Factory> = match kind {
            "app" => Arc::new(|| Ok(Box::new(App::default()) as Box<dyn Process>)),
            "worker" => Arc::new(move || Ok(Box::new(Worker(tenant.clone())) as Box<dyn Process>)),
            _ => return None,
        };
        Some((qualified.into(), factory))
    }
}

/// `spawn`: spawns the kind its input names, monitored, and completes with the child's
/// result. `wait`: completes with the first message's body.
#[derive(Default)]
struct App {
    method: String,
    kind: String,
    started: bool,
}

impl Process for App {
    fn init(&mut self, _: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        self.method = method.to_owned();
        self.kind = input.first().and_then(|p| p.as_str().map(str::to_owned)).unwrap_or_default();
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if self.method == "spawn" && !std::mem::replace(&mut self.started, true) {
            let request = SpawnRequest {
                kind: Some(self.kind.clone()),
                method: "main".into(),
                input: Vec::new(),
                monitor: true,
                link: false,
            };
            out.yield_command(1, Command::Spawn(request));
        }
        for event in events {
            match event {
                Event::Completion { result: Err(error), .. } => {
                    out.complete(Err(error));
                    return Ok(());
                }
                Event::Exit { reason, .. } => {
                    out.complete(reason.into_result().map_err(|reason| reason.to_string()));
                    return Ok(());
                }
                Event::Message { body, .. } => {
                    out.complete(Ok(body));
                    return Ok(());
                }
                _ => {}
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// Completes at once with its tenant's name.
struct Worker(String);

impl Process for Worker {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        out.complete(Ok(Payload::text(&self.0)));
        Ok(())
    }
}

fn spawn_in(s: &Scheduler, kind: &str, method: &str, input: &str) -> Result<Payload, ExitReason> {
    let options = wasmproc::scheduler::SpawnOptions::new(method).input(vec![Payload::text(input)]);
    let process = s.handle().spawn(Spawnable::kind(kind), options).expect("the source resolves the kind");
    process.join_timeout(HANG).expect("the process ends")
}

#[test]
fn a_source_resolves_kinds_in_the_spawners_scope() {
    let s = Scheduler::builder().workers(1).kind_source(Tenants).build().unwrap();
    // A bare name resolves in the spawner's tenant; a qualified one as it says.
    assert_eq!(spawn_in(&s, "acme/app", "spawn", "worker"), Ok(Payload::text("acme")));
    assert_eq!(spawn_in(&s, "globex/app", "spawn", "worker"), Ok(Payload::text("globex")));
    // A name no source resolves is an unknown kind, for the process and the embedder.
    let unknown = spawn_in(&s, "acme/app", "spawn", "nothing").expect_err("no such kind");
    assert!(matches!(&unknown, ExitReason::Error(e) if e.contains("unknown process kind `nothing`")), "{unknown:?}");
    let refused = s.handle().spawn(Spawnable::kind("worker"), "main").expect_err("the embedder names no tenant");
    assert!(refused.to_string().contains("worker"), "{refused}");
    s.stop(Duration::from_secs(1));
}

#[test]
fn a_durable_scheduler_remakes_source_kinds_on_resume() {
    let store = Arc::new(MemoryStore::new());
    let build = || {
        let journal = Journal::with_store(store.clone());
        Scheduler::builder().workers(1).journal(journal).kind_source(Tenants).build().unwrap()
    };
    let first = build();
    let waiting = first.handle().spawn(Spawnable::kind("acme/app"), "wait").expect("spawns");
    let pid = waiting.pid();
    first.stop(Duration::from_secs(1));
    assert!(waiting.try_result().is_some_and(|r| r.is_err()), "suspended, not finished");

    let second = build();
    let resumed = second.resumed();
    assert_eq!(resumed.iter().map(|h| h.pid()).collect::<Vec<_>>(), vec![pid], "the waiting process resumes");
    second.handle().send(pid, "go", Payload::text("resumed")).unwrap();
    assert_eq!(resumed[0].join_timeout(HANG), Some(Ok(Payload::text("resumed"))));
    second.stop(Duration::from_secs(1));
}

/// The embedder sees the pid before the spawn is journaled: one it refuses is dropped
/// without a trace in the journal, one it admits is journaled and resumes.
#[test]
fn a_spawn_reaches_the_journal_only_once_the_embedder_admits_it() {
    let store = Arc::new(MemoryStore::new());
    let build = || {
        let journal = Journal::with_store(store.clone());
        Scheduler::builder().workers(1).journal(journal).kind_source(Tenants).build().unwrap()
    };
    let first = build();
    let mut offered = None;
    let refused = first.handle().spawn_admitted(Spawnable::kind("acme/app"), "wait", |pid| {
        offered = Some(pid);
        Err("no room for its record".to_owned())
    });
    assert!(matches!(&refused, Err(SpawnError::Refused(why)) if why == "no room for its record"), "{refused:?}");
    assert!(offered.is_some(), "the pid was offered");
    let mut admitted_pid = None;
    let admitted = first
        .handle()
        .spawn_admitted(Spawnable::kind("acme/app"), "wait", |pid| {
            admitted_pid = Some(pid);
            Ok(())
        })
        .expect("admitted");
    assert_eq!(admitted_pid, Some(admitted.pid()), "the pid offered is the process's");
    first.stop(Duration::from_secs(1));

    let runs = Journal::with_store(store.clone()).runs().expect("the journal reads");
    assert_eq!(
        runs.iter().map(|run| run.root).collect::<Vec<_>>(),
        vec![admitted.pid()],
        "the refused one left no run"
    );
    let second = build();
    let resumed = second.resumed();
    assert_eq!(resumed.iter().map(|h| h.pid()).collect::<Vec<_>>(), vec![admitted.pid()]);
    second.handle().send(admitted.pid(), "go", Payload::text("resumed")).unwrap();
    assert_eq!(resumed[0].join_timeout(HANG), Some(Ok(Payload::text("resumed"))));
    second.stop(Duration::from_secs(1));
}
