//! The service in this process, where a test can hold what the server does off the
//! request's path.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Filter, PolicyFields, Service, ServiceConfig, StartRequest, State};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wasmproc-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn with_tour(name: &str) -> Service {
    with_tour_in(&scratch(name))
}

fn with_tour_in(dir: &std::path::Path) -> Service {
    let service = Service::open(ServiceConfig::new(dir)).expect("the service opens");
    service.add_tenant("acme", PolicyFields::default()).expect("a tenant");
    let bytes = std::fs::read(wasmproc_tests::guests::SDK_TOUR).expect("the SDK tour guest");
    service.deploy("acme", &bytes, Some("tour"), None).expect("the tour deploys");
    service
}

fn race(id: &str, input: serde_json::Value) -> StartRequest {
    StartRequest {
        id: Some(id.to_owned()),
        component: "tour".to_owned(),
        method: Some("race".to_owned()),
        input: Some(input),
        grants: super::Grants::default(),
        limits: super::Limits::default(),
    }
}

/// A workflow's result comes from its exit in the journal, not from the registry's
/// record of its end, which is written after: a `result` does not wait for that write,
/// and what the API shows of the workflow agrees with the result meanwhile.
#[test]
fn a_result_is_answered_from_the_journals_exit_before_its_record_is_written() {
    let service = with_tour("result-from-exit");
    let held = service.inner.hold_ends.lock();
    service.start("acme", race("w", json!([0]))).expect("it starts");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let record = runtime.block_on(service.wait("acme", "w", Duration::from_secs(10))).expect("its record");
    assert_eq!((record.state, record.result), (State::Completed, Some(json!({"ok": 0}))));
    let written = service.inner.registry.workflow("acme", "w").expect("the registry").expect("its record");
    assert_eq!(written.state, State::Running, "its end is not yet written");
    let listed = service.workflows("acme", &Filter::default()).expect("a list").workflows;
    assert_eq!(listed.iter().map(|w| (w.id.as_str(), w.state)).collect::<Vec<_>>(), [("w", State::Completed)]);
    assert_eq!(service.running(), 0);

    // Forgetting it waits for its end's record, which would otherwise come back after.
    let forgetting = std::thread::spawn({
        let service = service.clone();
        move || service.forget("acme", "w")
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(!forgetting.is_finished(), "forget waits for the end's record");
    drop(held);
    forgetting.join().expect("forget returns").expect("it is forgotten");
    assert_eq!(service.inner.registry.workflow("acme", "w").expect("the registry"), None);
    service.stop();
}

/// A workflow's end goes to the registry unsynced: the journal's exit record is what
/// holds it. Made here by putting back the record as it was before its end (as a crash
/// of the machine could leave it): the next server settles it from the journal, with
/// its result.
#[test]
fn an_end_the_registry_lost_is_settled_again_from_the_journal() {
    let dir = scratch("end-from-journal");
    let service = with_tour_in(&dir);
    let (running, _) = service.start("acme", race("w", json!([0]))).expect("it starts");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    runtime.block_on(service.wait("acme", "w", Duration::from_secs(10))).expect("its record");
    let deadline = Instant::now() + Duration::from_secs(10);
    while service.inner.registry.workflow("acme", "w").expect("the registry").map(|w| w.state) != Some(State::Completed)
    {
        assert!(Instant::now() < deadline, "its end is never recorded");
        std::thread::sleep(Duration::from_millis(10));
    }
    service.inner.registry.put_workflows(&[("acme", running)]).expect("the record as before its end");
    service.stop();
    drop(service);

    let service = Service::open(ServiceConfig::new(&dir)).expect("the service opens again");
    let record = service.workflow("acme", "w").expect("its record");
    assert_eq!((record.state, record.result), (State::Completed, Some(json!({"ok": 0}))));
    service.stop();
}

/// A start goes to the registry unsynced: the journal's spawn record holds the
/// workflow's record in its note, and the start is answered once that is committed.
/// Made here by removing the records of a running and an ended workflow (as a crash of
/// the machine could lose them): the next server makes both again from the journal,
/// the running one resumed under its pid and the ended one settled with its result.
#[test]
fn a_start_the_registry_lost_is_made_again_from_the_journal() {
    let dir = scratch("start-from-journal");
    let service = with_tour_in(&dir);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let (asleep, _) = service.start("acme", race("asleep", json!([60_000]))).expect("it starts");
    service.start("acme", race("done", json!([0]))).expect("it starts");
    runtime.block_on(service.wait("acme", "done", Duration::from_secs(10))).expect("its record");
    let deadline = Instant::now() + Duration::from_secs(10);
    while service.inner.registry.workflow("acme", "done").expect("the registry").map(|w| w.state)
        != Some(State::Completed)
    {
        assert!(Instant::now() < deadline, "its end is never recorded");
        std::thread::sleep(Duration::from_millis(10));
    }
    service.stop();
    drop(service);
    let registry = super::Registry::open(&dir.join("registry")).expect("the registry");
    for id in ["asleep", "done"] {
        registry.remove_workflow("acme", id).expect("removed");
    }
    assert_eq!(registry.counts("acme").of(State::Running) + registry.counts("acme").of(State::Completed), 0);
    drop(registry);

    let service = Service::open(ServiceConfig::new(&dir)).expect("the service opens again");
    let again = service.workflow("acme", "asleep").expect("made again");
    assert_eq!(again, asleep, "the same record: pid, input, grants, limits, start time");
    let done = service.workflow("acme", "done").expect("made again");
    assert_eq!((done.state, done.result), (State::Completed, Some(json!({"ok": 0}))));
    let counts = service.counts("acme", &super::CountFilter::default()).expect("counts");
    assert_eq!((counts.running, counts.completed, counts.exact), (1, 1, true));
    service.terminate("acme", "asleep").expect("it runs, and is terminated");
    let ended = runtime.block_on(service.wait("acme", "asleep", Duration::from_secs(20))).expect("its record");
    assert_eq!(ended.state, State::Failed);
    service.stop();
}

/// A listing is walked a page at a time (`after` = the last page's `next`) while other
/// workflows are started: every workflow there before the walk is listed exactly once,
/// in id order, and nothing is listed twice.
#[test]
fn a_walk_of_the_pages_lists_each_workflow_once_while_more_are_started() {
    let service = with_tour("pages-while-started");
    // Ids of two sorts that interleave by id: `w-NNN-a` first, `w-NNN-b` during the walk.
    let before: Vec<String> = (0..120).map(|i| format!("w-{i:03}-a")).collect();
    for id in &before {
        service.start("acme", race(id, json!([0]))).expect("it starts");
    }
    let adding = std::thread::spawn({
        let service = service.clone();
        move || {
            for i in (0..120).rev() {
                service.start("acme", race(&format!("w-{i:03}-b"), json!([0]))).expect("it starts");
            }
        }
    });
    let mut seen: Vec<String> = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let filter = Filter { after: after.clone(), limit: Some(7), ..Filter::default() };
        let page = service.workflows("acme", &filter).expect("a page");
        assert!(
            page.workflows.len() <= 7 && page.examined <= 8,
            "{} listed, {} read",
            page.workflows.len(),
            page.examined
        );
        seen.extend(page.workflows.into_iter().map(|w| w.id));
        pages += 1;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    adding.join().expect("the starts end");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in id order, none twice: {seen:?}");
    for id in &before {
        assert!(seen.contains(id), "`{id}` is not listed: {seen:?}");
    }
    assert!(seen.iter().all(|id| id.starts_with("w-")), "{seen:?}");
    assert!(pages > 120 / 7, "{pages} pages");
    service.stop();
}

/// A listing reads at most `MOST_EXAMINED` records: a filter that none of those match
/// answers an empty page that says so, with where to go on from; going on finds the
/// match after them. A page's size is 1 to 1,000, anything else a clear refusal.
#[test]
fn a_listing_reads_a_bounded_number_of_records_and_says_where_to_go_on() {
    let service = with_tour("bounded-listing");
    let (running, _) = service.start("acme", race("seed", json!([0]))).expect("it starts");
    let component = running.component.clone();
    let record = |id: String, state: State| super::WorkflowRecord {
        id,
        state,
        result: Some(json!({"ok": 0})),
        ended_ms: Some(running.started_ms),
        ..running.clone()
    };
    let mut records: Vec<_> =
        (0..super::MOST_EXAMINED).map(|i| ("acme", record(format!("a-{i:05}"), State::Completed))).collect();
    records.push(("acme", record("b-failed".to_owned(), State::Failed)));
    service.inner.registry.put_journaled(&records).expect("the records");

    let failed = Filter { state: Some(State::Failed), ..Filter::default() };
    let first = service.workflows("acme", &failed).expect("a page");
    let last_read = format!("a-{:05}", super::MOST_EXAMINED - 1);
    assert_eq!((first.workflows.len(), first.examined), (0, super::MOST_EXAMINED));
    assert_eq!(first.next.as_deref(), Some(last_read.as_str()));
    let second = service.workflows("acme", &Filter { after: first.next, ..failed.clone() }).expect("a page");
    let ids: Vec<&str> = second.workflows.iter().map(|w| w.id.as_str()).collect();
    assert_eq!((ids, second.next), (vec!["b-failed"], None));
    // A prefix is a range of its own: it reads only the ids in it.
    let prefixed = Filter { prefix: Some("b-".to_owned()), ..failed.clone() };
    let page = service.workflows("acme", &prefixed).expect("a page");
    assert_eq!((page.workflows.len(), page.examined, page.next), (1, 1, None));
    for after in ["a", "b-", "b-failed", "c", "\u{10ffff}"] {
        let page = service.workflows("acme", &Filter { after: Some(after.to_owned()), ..prefixed.clone() });
        let page = page.expect("a page");
        assert_eq!((page.workflows.len(), page.next), (usize::from(after < "b-failed"), None), "after `{after}`");
    }
    // The counts of a filter past the bound are said inexact; without one, exact.
    let counts = service
        .counts("acme", &super::CountFilter { component: Some(component), ..Default::default() })
        .expect("counts");
    assert!(!counts.exact && counts.completed as usize + counts.failed as usize <= super::MOST_EXAMINED, "{counts:?}");
    let all = service.counts("acme", &super::CountFilter::default()).expect("counts");
    assert_eq!((all.completed + all.running, all.failed, all.exact), (super::MOST_EXAMINED as u64 + 1, 1, true));

    for limit in [0, 1001] {
        let refusal = service.workflows("acme", &Filter { limit: Some(limit), ..Filter::default() }).unwrap_err();
        assert_eq!((refusal.status, refusal.code), (400, "invalid"), "{}", refusal.message);
        assert!(refusal.message.contains(&format!("`limit` {limit}")), "{}", refusal.message);
    }
    service.stop();
}

/// The counts by state are the registry's, kept as records are written, plus the ends
/// not yet written: exact while ends wait to be recorded, while they are recorded, and
/// after a restart.
#[test]
fn the_counts_by_state_are_exact_while_ends_are_recorded_and_after_a_restart() {
    let dir = scratch("counts-kept");
    let service = with_tour_in(&dir);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let counts = |service: &Service| {
        let c = service.counts("acme", &super::CountFilter::default()).expect("counts");
        (c.running, c.completed, c.failed, c.exact)
    };
    service.start("acme", race("asleep", json!([60_000]))).expect("it starts");
    let held = service.inner.hold_ends.lock();
    for i in 0..40 {
        service.start("acme", race(&format!("done-{i}"), json!([0]))).expect("it starts");
    }
    let mut fails = race("fails", json!("on purpose"));
    fails.method = Some("fails".to_owned());
    service.start("acme", fails).expect("it starts");
    for id in (0..40).map(|i| format!("done-{i}")).chain(["fails".to_owned()]) {
        let ended = runtime.block_on(service.wait("acme", &id, Duration::from_secs(20))).expect("its record");
        assert_ne!(ended.state, State::Running, "{id}");
    }
    let recorded = service.inner.registry.counts("acme");
    assert_eq!(recorded.of(State::Running), 42, "no end is recorded yet");
    assert_eq!(counts(&service), (1, 40, 1, true));

    // While the ends are written and leave `live`, no count is off by one of them.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(20);
    while service.inner.registry.counts("acme").of(State::Running) > 1 {
        assert_eq!(counts(&service), (1, 40, 1, true));
        assert!(Instant::now() < deadline, "the ends are never recorded");
    }
    assert_eq!(counts(&service), (1, 40, 1, true));
    service.stop();
    drop(service);

    let service = Service::open(ServiceConfig::new(&dir)).expect("the service opens again");
    assert_eq!(counts(&service), (1, 40, 1, true));
    service.forget("acme", "done-0").expect("forgotten");
    assert_eq!(counts(&service), (1, 39, 1, true));
    service.terminate("acme", "asleep").expect("terminated");
    runtime.block_on(service.wait("acme", "asleep", Duration::from_secs(20))).expect("its record");
    assert_eq!(counts(&service), (0, 39, 2, true));
    service.stop();
}

/// The counts kept beside the watched workflows follow every insert, end and removal:
/// each tenant's workflows there, and those of them running.
#[test]
fn watched_workflows_are_counted_by_tenant_and_running() {
    use crate::{Process, Scheduler};
    let scheduler = Scheduler::builder().workers(1).build().expect("a scheduler");
    let live = || {
        let handle = scheduler.handle().spawn(Box::new(crate::testing::Idle) as Box<dyn Process>, "main").unwrap();
        let record = super::WorkflowRecord {
            id: String::new(),
            component: String::new(),
            method: "main".to_owned(),
            input: None,
            pid: handle.pid().as_u64(),
            state: State::Running,
            started_ms: 0,
            ended_ms: None,
            result: None,
            grants: super::Grants::default(),
            limits: super::Limits::default(),
        };
        Box::new(super::Live { handle, record, ended: None, end: None })
    };
    let key = |tenant: &str, id: &str| (tenant.to_owned(), id.to_owned());
    let ended = || (crate::step::Exited::new(crate::ExitReason::Killed), 1);
    let mut watched = super::Watched::default();
    watched.insert(key("acme", "a"), live());
    watched.insert(key("acme", "b"), live());
    watched.insert(key("globex", "c"), live());
    assert_eq!((watched.of_tenant("acme"), watched.running_of("acme"), watched.running()), (2, 2, 3));
    assert!(watched.end(&key("acme", "a"), ended()).is_some());
    assert!(watched.end(&key("acme", "a"), ended()).is_some(), "an end given twice counts once");
    assert!(watched.end(&key("acme", "z"), ended()).is_none());
    assert_eq!((watched.of_tenant("acme"), watched.running_of("acme"), watched.running()), (2, 1, 2));
    assert!(watched.remove(&key("acme", "a")).is_some(), "an ended one leaves");
    assert!(watched.remove(&key("acme", "b")).is_some(), "a running one leaves");
    assert!(watched.remove(&key("acme", "b")).is_none());
    assert_eq!((watched.of_tenant("acme"), watched.running_of("acme"), watched.running()), (0, 0, 1));
    assert_eq!((watched.of_tenant("globex"), watched.running_of("globex")), (1, 1));
    watched.insert(key("globex", "c"), live());
    assert_eq!((watched.of_tenant("globex"), watched.running_of("globex")), (1, 1), "replaced, not added");
    assert!(watched.per_tenant.keys().chain(watched.running.keys()).all(|tenant| tenant == "globex"));
}
