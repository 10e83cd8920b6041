use std::time::Duration;

use wasmproc::{Capabilities, Command, Outcome, Payload, Scheduler, SpawnRequest};
use wasmproc_tests::{complete_now, custom, stash};

/// Runs one process on `s` that yields `command` and returns the completion it got.
fn outcome_of(s: &Scheduler, caps: Option<Capabilities>, command: Command) -> Outcome {
    wasmproc_tests::outcome_of(s.handle(), caps, command)
}

fn scheduler() -> Scheduler {
    let (stash, stashed) = stash();
    // Completers handed to this thread are dropped without being completed.
    std::thread::spawn(move || stashed.into_iter().for_each(drop));
    Scheduler::builder()
        .workers(2)
        .capabilities(Capabilities::default().allow_all_custom())
        .handler("now", complete_now)
        .handler("fails", |r: wasmproc::handler::Request| {
            let error = format!("no rows for {:?}", r.payload().as_str());
            r.complete(Err(error));
        })
        .handler("panics", |_: wasmproc::handler::Request| panic!("handler bug"))
        .handler("forgets", stash)
        .handler("elsewhere", |r: wasmproc::handler::Request| {
            let (payload, done) = r.into_parts();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2));
                done.complete(Ok(payload));
            });
        })
        .build()
        .unwrap()
}

#[test]
fn unknown_command_completes_with_an_error() {
    let s = scheduler();
    assert_eq!(outcome_of(&s, None, custom("teleport")), Err("unknown command `teleport`".to_owned()));
}

#[test]
fn handler_error_is_the_completion() {
    let s = scheduler();
    let command = Command::Custom { name: "fails".into(), payload: Payload::text("users") };
    assert_eq!(outcome_of(&s, None, command), Err("no rows for Some(\"users\")".to_owned()));
}

#[test]
fn handler_completing_later_from_another_thread() {
    let s = scheduler();
    let command = Command::Custom { name: "elsewhere".into(), payload: Payload::text("echo") };
    assert_eq!(outcome_of(&s, None, command), Ok(Payload::text("echo")));
}

#[test]
fn handler_panic_or_lost_completer_completes_with_an_error() {
    let s = scheduler();
    assert_eq!(
        outcome_of(&s, None, custom("panics")),
        Err("command handler dropped the yield without completing it".to_owned())
    );
    assert_eq!(
        outcome_of(&s, None, custom("forgets")),
        Err("command handler dropped the yield without completing it".to_owned())
    );
    assert_eq!(outcome_of(&s, None, custom("now")), Ok(Payload::empty()), "the host is unaffected");
}

#[test]
fn ungranted_commands_are_permission_denied() {
    let s = scheduler();
    let only_sleep = Capabilities::none().allow("sleep");
    assert_eq!(outcome_of(&s, Some(only_sleep.clone()), custom("now")), Err("permission denied: now".to_owned()));
    let spawn = Command::Spawn(SpawnRequest { kind: Some("x".into()), method: "main".into(), ..Default::default() });
    assert_eq!(outcome_of(&s, Some(only_sleep.clone()), spawn), Err("permission denied: spawn".to_owned()));
    assert_eq!(outcome_of(&s, Some(only_sleep), Command::Sleep(Duration::ZERO)), Ok(Payload::empty()));
    // Default capabilities deny custom commands.
    let defaults = Scheduler::builder().workers(1).handler("now", complete_now).build().unwrap();
    assert_eq!(outcome_of(&defaults, None, custom("now")), Err("permission denied: now".to_owned()));
}

#[test]
fn builder_rejects_bad_settings_with_clear_errors() {
    let err = |b: wasmproc::scheduler::Builder| b.build().err().unwrap().to_string();
    assert!(err(Scheduler::builder().workers(0)).contains("`workers` must be between 1 and"));
    assert!(err(Scheduler::builder().mailbox_capacity(0)).contains("`mailbox_capacity`"));
    assert!(err(Scheduler::builder().handler("send", complete_now)).contains("built-in"));
}

/// Workers keep the custom commands they resolved (handler and permission); processes with
/// other capabilities, interleaved on the one worker, yielding the same names by other
/// means (a `&'static str`, an owned string) and more names than a worker keeps, each get
/// their own answer every time.
#[test]
fn a_worker_resolves_each_command_for_each_process_s_own_capabilities() {
    use wasmproc::scheduler::SpawnOptions;
    use wasmproc_tests::{Scripted, completion};

    let s = Scheduler::builder()
        .workers(1)
        .turn_budget(1)
        .handler("now", complete_now)
        .handler("kv.*", complete_now)
        .build()
        .unwrap();
    // Each step yields the command its place names and ends after the last.
    let names: Vec<String> = (0..40)
        .map(|i| match i % 4 {
            0 => "now".to_owned(),
            1 => format!("kv.get{}", i % 12),
            2 => format!("lost{}", i % 10),
            _ => "kv.get0".to_owned(),
        })
        .collect();
    let run = |caps: Capabilities| {
        let names = names.clone();
        let (process, probe) = Scripted::new(move |t| {
            match names.get(t.step) {
                // Static and owned names in turn: both must resolve alike.
                Some(name) if name == "now" && t.step % 8 == 0 => t.out.yield_command(t.step as u64, custom("now")),
                Some(name) => t.out.yield_command(
                    t.step as u64,
                    Command::Custom { name: name.clone().into(), payload: Payload::empty() },
                ),
                None => t.out.complete(Ok(Payload::empty())),
            }
            Ok(())
        });
        (s.handle().spawn(process, SpawnOptions::new("main").capabilities(caps)).unwrap(), probe)
    };
    // What each process must get for each name: `lost*` has no handler, whatever the
    // capabilities; the rest is `ok` where granted.
    type Grants = fn(&str) -> bool;
    let granted: [(Capabilities, Grants); 4] = [
        (Capabilities::default().allow_all_custom(), |_| true),
        (Capabilities::none(), |_| false),
        (Capabilities::none().allow("kv.*"), |name| name.starts_with("kv.")),
        (Capabilities::none().allow("now"), |name| name == "now"),
    ];
    let running: Vec<_> = granted.into_iter().map(|(caps, granted)| (run(caps), granted)).collect();
    for ((process, probe), granted) in running {
        let expect = |name: &str| match name {
            n if n.starts_with("lost") => "unknown",
            n if granted(n) => "ok",
            _ => "denied",
        };
        process.join_timeout(wasmproc_tests::HANG).expect("it ends").expect("it succeeds");
        let events = probe.events();
        assert_eq!(events.len(), names.len());
        for (step, name) in names.iter().enumerate() {
            let outcome = completion(&events[step], step as u64).expect("the completion of each step's yield");
            let got = match outcome {
                Ok(_) => "ok",
                Err(e) if *e == format!("unknown command `{name}`") => "unknown",
                Err(e) if *e == format!("permission denied: {name}") => "denied",
                Err(e) => panic!("unexpected completion of `{name}`: {e}"),
            };
            assert_eq!(got, expect(name), "step {step}, `{name}`");
        }
    }
}
