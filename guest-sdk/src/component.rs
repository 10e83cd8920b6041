//! The component boundary: the WIT bindings, the entry table, and the exports that drive
//! the executor.
//!
//! `wasmproc_guest::export!` implements the generated `Guest` trait in the user's crate
//! by forwarding to [`entries`], [`init`] and [`step`] here with the crate's entry table;
//! those convert between the WIT types and the executor's at the boundary, and keep the
//! one process an instance runs in a thread-local (a guest has one thread).

use std::cell::RefCell;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ctx::Ctx;
use crate::executor::{self, Executor, Task};
use crate::payload::{Payload, Pid};

use crate::host::bindings::wasmproc::process::types as wit;

/// One entry method: its name, and how to start it. Built by `#[entry]`.
#[doc(hidden)]
pub struct Entry {
    name: &'static str,
    start: fn(Ctx, Vec<Payload>) -> anyhow::Result<Task>,
}

impl Entry {
    /// The entry `name`, started by `start`.
    pub const fn new(name: &'static str, start: fn(Ctx, Vec<Payload>) -> anyhow::Result<Task>) -> Self {
        Entry { name, start }
    }
}

/// Decodes the entry's input from the first payload (JSON `null` if there is none), calls
/// `entry`, and wraps its future into a task whose outcome is the JSON result or the
/// error's whole chain.
#[doc(hidden)]
pub fn start<F, Fut, T, R, E>(entry: F, ctx: Ctx, input: Vec<Payload>) -> anyhow::Result<Task>
where
    F: FnOnce(Ctx, T) -> Fut,
    T: DeserializeOwned,
    Fut: Future<Output = Result<R, E>> + 'static,
    R: Serialize,
    E: Into<anyhow::Error>,
{
    let input = match input.into_iter().next() {
        Some(payload) => payload.decode()?,
        None => serde_json::from_value(serde_json::Value::Null)?,
    };
    let future = entry(ctx, input);
    Ok(Box::pin(async move {
        match future.await {
            Ok(value) => Payload::json(&value).map_err(|error| format!("failed to serialise a JSON payload: {error}")),
            Err(error) => Err(format!("{:#}", error.into())),
        }
    }))
}

thread_local! {
    static PROCESS: RefCell<Option<Executor>> = const { RefCell::new(None) };
}

/// The `entries` export.
#[doc(hidden)]
pub fn entries(table: &[Entry]) -> Vec<String> {
    table.iter().map(|entry| entry.name.to_owned()).collect()
}

/// The `init` export: starts the entry `method` of `table` as process `pid`.
#[doc(hidden)]
pub fn init(table: &[Entry], pid: u64, method: String, input: Vec<wit::Payload>) -> Result<(), String> {
    let entry =
        table.iter().find(|entry| entry.name == method).ok_or_else(|| format!("unknown entry method `{method}`"))?;
    crate::logger::install();
    let mut executor = Executor::new(crate::host::identity(Pid::from_u64(pid)));
    let mut input: Vec<Payload> = input.into_iter().map(Payload::from).collect();
    if let Some(at) = input.iter().position(|p| p.format.as_str() == crate::service::WORKFLOW_ID_FORMAT) {
        let workflow = input.remove(at);
        executor.shared().set_workflow(String::from_utf8_lossy(&workflow.data).into_owned());
    }
    let task = (entry.start)(Ctx::new(executor.shared()), input)
        .map_err(|error| format!("invalid input for entry method `{method}`: {error:#}"))?;
    executor.start(task);
    PROCESS.with_borrow_mut(|process| *process = Some(executor));
    Ok(())
}

/// The `step` export. While the process has more to do (its task has not completed),
/// it stays in this call: it ends each step in the host's `wait`, which hands back the
/// output and answers with the next step's events, so a message costs no call of `step`.
/// It returns when the task completes, or when the host tells it to (the process waited
/// long, and the host takes back the call's stack).
#[doc(hidden)]
pub fn step(events: Vec<wit::Event>) -> wit::StepOutput {
    let mut events = events;
    loop {
        let output = PROCESS.with_borrow_mut(|process| match process {
            Some(executor) => executor.step(events.into_iter().map(executor::Event::from)),
            None => executor::StepOutput {
                status: executor::Status::Complete(Err("`step` was called before `init`".to_owned())),
                yields: Vec::new(),
            },
        });
        if matches!(output.status, executor::Status::Complete(_)) {
            return output.into();
        }
        match crate::host::wait(output.into()) {
            Ok(next) => events = next,
            Err(output) => return output,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn double(ctx: Ctx, n: Option<u32>) -> anyhow::Result<u32> {
        let n = n.unwrap_or(21);
        ctx.sleep(std::time::Duration::from_millis(u64::from(n))).await?;
        anyhow::ensure!(n < 1000, "{n} is too large");
        Ok(n * 2)
    }

    static TABLE: &[Entry] = &[Entry::new("double", |ctx, input| start(double, ctx, input))];

    fn json(value: u32) -> Vec<wit::Payload> {
        vec![Payload::json(&value).unwrap().into()]
    }

    fn finish(sleep_tag: u64) -> wit::StepOutput {
        let done = wit::Completion { tag: sleep_tag, result: Ok(Payload::bytes([]).into()) };
        step(vec![wit::Event::Completion(done)])
    }

    #[test]
    fn lists_entries_and_rejects_unknown_methods() {
        assert_eq!(entries(TABLE), ["double"]);
        assert_eq!(init(TABLE, 1, "triple".to_owned(), vec![]), Err("unknown entry method `triple`".to_owned()));
    }

    #[test]
    fn rejects_input_of_the_wrong_shape() {
        let error = init(TABLE, 1, "double".to_owned(), vec![Payload::json("six").unwrap().into()]).unwrap_err();
        assert!(
            error.starts_with("invalid input for entry method `double`: failed to decode a `json` payload"),
            "{error}"
        );
    }

    #[test]
    fn runs_an_entry_through_the_exports() {
        init(TABLE, 3, "double".to_owned(), json(4)).unwrap();
        let first = step(vec![]);
        assert!(matches!(first.status, wit::Status::Blocked));
        assert!(matches!(
            first.yields.as_slice(),
            [wit::YieldCommand { tag: 1, command: wit::Command::Sleep(4_000_000) }]
        ));
        let last = finish(1);
        let wit::Status::Complete(Ok(result)) = last.status else { panic!("not complete") };
        assert_eq!((result.format.as_str(), result.data.as_slice()), ("json", b"8".as_slice()));
    }

    #[test]
    fn missing_input_is_null_and_errors_keep_their_message() {
        init(TABLE, 3, "double".to_owned(), vec![]).unwrap();
        assert!(matches!(
            step(vec![]).yields.as_slice(),
            [wit::YieldCommand { command: wit::Command::Sleep(21_000_000), .. }]
        ));
        assert!(matches!(finish(1).status, wit::Status::Complete(Ok(_))));

        init(TABLE, 3, "double".to_owned(), json(2000)).unwrap();
        step(vec![]);
        let wit::Status::Complete(Err(error)) = finish(1).status else { panic!("not an error") };
        assert_eq!(error, "2000 is too large");
    }

    #[test]
    fn step_before_init_is_an_error() {
        PROCESS.with_borrow_mut(|process| *process = None);
        assert!(matches!(step(vec![]).status, wit::Status::Complete(Err(_))));
    }
}
