//! Requests: messages a workflow answers while its caller waits for the answer
//! (`POST /v1/workflows/{id}/request`, `wasmproc request`).
//!
//! # Protocol
//!
//! 1. **Recorded.** A new request is written to the registry (synced) under its id, the
//!    caller's (`"id"` in the body, or the `Idempotency-Key` header) or one drawn at
//!    random, with its topic and body, before it is sent.
//! 2. **Delivered.** It goes to the workflow's root process as a message from the host,
//!    topic `wasmproc:request:ID:TOPIC` ([`TOPIC_PREFIX`]), which the journal records in
//!    the workflow's history before delivering it: from then on a crash cannot lose the
//!    delivery, and the journal's replay never makes a second one.
//! 3. **Answered.** The workflow answers with the custom command `workflow.answer`
//!    ([`ANSWER`]; input `{"request": ID, "ok": VALUE}` or `{"request": ID, "error":
//!    TEXT}`). A command, so the answer is part of its step's record, committed before it
//!    is carried out. Carrying it out writes the answer into the request's registry record
//!    (synced), wakes the callers waiting on it, and then completes the command. A crash
//!    between the step's record and that write runs the command again when the workflow
//!    resumes (a command whose completion no step consumed runs again), with the same
//!    idempotency key, which is how the second write is known to be the same answer.
//! 4. **Reconciled at start.** A request recorded (1) whose message is not in the
//!    workflow's journal (the server died between 1 and 2) is delivered then, once.
//!
//! Asking again with the same id gets the answer if there is one, even once the workflow
//! has ended; waits for it if the request was delivered and is not answered yet; 410 if
//! the workflow ended without answering; 409 if the id came with another topic or body.
//! Requests are kept with their workflow until it is forgotten.
//!
//! Only the root process of a workflow answers its requests: they are delivered to it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};
use tokio::sync::watch;
use wasmproc_types::{Payload, Pid};

use super::registry::{Registry, State};
use super::{Inner, Refusal, Service, code, now_ms, secret};
use crate::error::SendError;
use crate::handler::{Completer, Provider, Request};

/// The topics of request messages begin with this, then `ID:TOPIC`. Signals may not use
/// topics that begin with `wasmproc:`, so a request cannot be forged.
pub const TOPIC_PREFIX: &str = "wasmproc:request:";

/// The custom command a workflow answers a request with.
pub const ANSWER: &str = "workflow.answer";

/// The prefix of topics the service keeps for itself.
pub(super) const RESERVED: &str = "wasmproc:";

/// A request as the registry keeps it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub(super) struct RequestRecord {
    pub(super) id: String,
    pub(super) topic: String,
    pub(super) body: Value,
    /// When it was recorded, in milliseconds since the Unix epoch.
    pub(super) asked_ms: u64,
    /// `{"ok": VALUE}` or `{"error": TEXT}` once answered.
    pub(super) answer: Option<Value>,
    /// The idempotency key of the `workflow.answer` command that answered it.
    pub(super) answer_key: Option<String>,
    pub(super) answered_ms: Option<u64>,
}

/// What a request asks: see [`Service::submit_request`].
pub use super::wire::WorkflowRequest as Ask;

/// A request's answer, or where it stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Answered {
    /// The workflow answered with this value.
    Ok(Value),
    /// The workflow answered with this error.
    Error(String),
    /// No answer yet (the wait ran out): ask again with the same id.
    Pending,
}

/// A request recorded and delivered, or answered already: see [`Service::await_answer`].
pub struct Submitted {
    /// The request's id.
    pub id: String,
    workflow: String,
    tenant: String,
    now: Option<Answered>,
    answer: Option<watch::Receiver<Option<Value>>>,
    ended: Option<watch::Receiver<bool>>,
}

type Key = (String, String, String);

/// The service's requests in memory: who waits for which, and which workflows' root
/// processes answer them.
pub(super) struct Requests {
    /// Workflows by their root process, for `workflow.answer`.
    roots: RwLock<HashMap<Pid, (String, String)>>,
    /// The callers waiting for each unanswered request.
    waiting: Mutex<HashMap<Key, watch::Sender<Option<Value>>>>,
    /// Unanswered requests by workflow, for `max_pending`.
    unanswered: Mutex<HashMap<(String, String), usize>>,
    /// Requests being recorded now, so two callers with one new id record it once.
    claims: Mutex<HashSet<Key>>,
    /// The answers' thread's work (started once the service has reattached its
    /// workflows, so that every root is known before an answer is looked up).
    answers: std::sync::mpsc::Sender<Answering>,
    answers_from: Mutex<Option<std::sync::mpsc::Receiver<Answering>>>,
    max_pending: usize,
}

/// A `workflow.answer` to carry out on the answers' thread.
struct Answering {
    caller: Pid,
    key: Option<String>,
    input: Payload,
    done: Completer,
}

/// The provider of `workflow.*`: hands each answer to the answers' thread, since writing
/// it is a synced write that must not hold up a worker.
pub(super) struct AnswerProvider(pub(super) Arc<Requests>);

impl Provider for AnswerProvider {
    fn family(&self) -> &str {
        "workflow"
    }

    fn handle(&self, request: Request<'_>) {
        if request.name() != ANSWER {
            let name = request.name().to_owned();
            request.complete(Err(format!("unknown command `{name}`: the service serves `{ANSWER}`")));
            return;
        }
        let (caller, key) = (request.caller(), request.idempotency_key());
        let (input, done) = request.into_parts();
        if let Err(refused) = self.0.answers.send(Answering { caller, key, input, done }) {
            refused.0.done.complete(Err("the service is stopping".to_owned()));
        }
    }
}

impl Requests {
    pub(super) fn new(max_pending: usize) -> Requests {
        let (answers, answers_from) = std::sync::mpsc::channel();
        Requests {
            roots: RwLock::default(),
            waiting: Mutex::default(),
            unanswered: Mutex::default(),
            claims: Mutex::default(),
            answers,
            answers_from: Mutex::new(Some(answers_from)),
            max_pending,
        }
    }

    /// Knows `root` as the root process of `tenant`'s workflow `id`.
    pub(super) fn track(&self, root: Pid, tenant: &str, id: &str) {
        self.roots.write().insert(root, (tenant.to_owned(), id.to_owned()));
    }

    /// Forgets what is kept in memory for `tenant`'s workflow `id`, which has ended: its
    /// root `root` (none when a workflow ended before is forgotten: its root went at its
    /// end), and its waiting callers, who see the end (their channel closes).
    pub(super) fn ended(&self, root: Option<Pid>, tenant: &str, id: &str) {
        if let Some(root) = root {
            let mut roots = self.roots.write();
            if roots.get(&root).is_some_and(|(t, i)| t == tenant && i == id) {
                roots.remove(&root);
            }
        }
        self.waiting.lock().retain(|(t, i, _), _| !(t == tenant && i == id));
        self.unanswered.lock().remove(&(tenant.to_owned(), id.to_owned()));
    }
}

/// Starts the answers' thread and delivers the requests recorded but not delivered
/// before the last stop (step 4 of the protocol). Called once the workflows are
/// reattached.
pub(super) fn start(inner: &Arc<Inner>) -> anyhow::Result<()> {
    let registry = &inner.registry;
    for (tenant, workflow) in registry.all_workflows()? {
        if workflow.state != State::Running {
            continue;
        }
        let unanswered: Vec<_> =
            registry.requests(&tenant, &workflow.id)?.into_iter().filter(|r| r.answer.is_none()).collect();
        if unanswered.is_empty() {
            continue;
        }
        inner.requests.unanswered.lock().insert((tenant.clone(), workflow.id.clone()), unanswered.len());
        let root = Pid::from_u64(workflow.pid);
        let delivered = inner.journal.process_now(root)?.map(|now| now.host_messages).unwrap_or_default();
        for request in unanswered {
            let prefix = format!("{TOPIC_PREFIX}{}:", request.id);
            if delivered.iter().any(|topic| topic.starts_with(&prefix)) {
                continue;
            }
            tracing::info!(
                "delivering request `{}` to workflow `{}`, recorded before a crash",
                request.id,
                workflow.id
            );
            if let Err(error) = deliver(inner, root, &request) {
                tracing::warn!("cannot deliver request `{}` to workflow `{}`: {error}", request.id, workflow.id);
            }
        }
    }
    let work = inner.requests.answers_from.lock().take().expect("the answers' thread starts once");
    let weak = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name("wasmproc-serve-answers".to_owned())
        .spawn(move || {
            while let Ok(answering) = work.recv() {
                let Some(inner) = weak.upgrade() else { return };
                let result = answer(&inner, &answering);
                answering.done.complete(result.map(|()| Payload::empty()));
            }
        })
        .map_err(|e| anyhow::anyhow!("cannot start the service's answers' thread: {e}"))?;
    Ok(())
}

fn deliver(inner: &Inner, root: Pid, request: &RequestRecord) -> Result<(), SendError> {
    let topic = format!("{TOPIC_PREFIX}{}:{}", request.id, request.topic);
    let body = Payload::json(&request.body).map_err(|e| SendError::Journal(format!("the body: {e}")))?;
    inner.handle.send(root, topic, body)
}

/// Carries out one `workflow.answer`.
fn answer(inner: &Inner, answering: &Answering) -> Result<(), String> {
    let requests = &inner.requests;
    let Some((tenant, workflow)) = requests.roots.read().get(&answering.caller).cloned() else {
        return Err(format!(
            "process {} is not the root process of a running workflow: only that process answers its requests",
            answering.caller
        ));
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Input {
        request: String,
        #[serde(default)]
        ok: Option<Value>,
        #[serde(default)]
        error: Option<String>,
    }
    let input: Input = answering
        .input
        .decode()
        .map_err(|e| format!("bad input to `{ANSWER}`: {e}: expected {{\"request\": ID, \"ok\": VALUE}}"))?;
    let answer = match (input.ok, input.error) {
        (Some(value), None) => json!({ "ok": value }),
        (None, Some(error)) => json!({ "error": error }),
        _ => return Err(format!("bad input to `{ANSWER}`: give one of `ok` and `error`")),
    };
    let failed = |e: anyhow::Error| format!("the server cannot record the answer: {e:#}");
    let mut record = inner
        .registry
        .request(&tenant, &workflow, &input.request)
        .map_err(failed)?
        .ok_or_else(|| format!("workflow `{workflow}` has no request `{}`", input.request))?;
    if record.answer.is_some() {
        // The same command carried out again after a crash: its answer is in already.
        if record.answer_key.is_some() && record.answer_key == answering.key {
            return Ok(());
        }
        return Err(format!("request `{}` was answered already; each request is answered once", input.request));
    }
    record.answer = Some(answer.clone());
    record.answer_key.clone_from(&answering.key);
    record.answered_ms = Some(now_ms());
    inner.registry.put_request(&tenant, &workflow, &record).map_err(failed)?;
    if let Some(count) = requests.unanswered.lock().get_mut(&(tenant.clone(), workflow.clone())) {
        *count = count.saturating_sub(1);
    }
    if let Some(waiting) = requests.waiting.lock().remove(&(tenant, workflow, input.request)) {
        waiting.send_replace(Some(answer));
    }
    Ok(())
}

fn answered(answer: &Value) -> Answered {
    match answer.get("error").and_then(Value::as_str) {
        Some(error) => Answered::Error(error.to_owned()),
        None => Answered::Ok(answer.get("ok").cloned().unwrap_or(Value::Null)),
    }
}

/// A claim on a request's id while it is recorded; released when dropped.
struct Claim<'a> {
    claims: &'a Mutex<HashSet<Key>>,
    key: Key,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.claims.lock().remove(&self.key);
    }
}

impl Service {
    /// Records request `ask` to `tenant`'s workflow `workflow` and delivers it, unless
    /// a request of the same id was made before (see the module's docs). Blocks for a
    /// synced write: call it off the async threads.
    ///
    /// # Errors
    ///
    /// No such workflow (404); an invalid id or topic (400); the same id with another
    /// topic or body (409); a workflow that has ended (409, or 410 if it ended without
    /// answering this request); its mailbox full, or too many of its requests unanswered
    /// (429).
    pub fn submit_request(&self, tenant: &str, workflow: &str, ask: Ask) -> Result<Submitted, Refusal> {
        let inner = &self.inner;
        let id = match ask.id {
            Some(id) if code::valid_name(&id) => id,
            Some(id) => {
                return Err(Refusal::invalid(format!(
                    "invalid request id `{id}`: 1 to 64 letters, digits, `-`, `_` or `.`"
                )));
            }
            None => secret("")?[..20].to_owned(),
        };
        if ask.topic.is_empty() {
            return Err(Refusal::invalid("`topic` must not be empty"));
        }
        let record = self.workflow(tenant, workflow)?;
        let key: Key = (tenant.to_owned(), workflow.to_owned(), id.clone());
        let _claim = loop {
            if inner.requests.claims.lock().insert(key.clone()) {
                break Claim { claims: &inner.requests.claims, key: key.clone() };
            }
            // Another caller is recording the same id now: its answer is this one's.
            std::thread::sleep(Duration::from_millis(5));
        };
        let ended = inner.live.lock().get_mut(&(tenant.to_owned(), workflow.to_owned())).map(|l| l.waiter());
        let mut submitted = Submitted {
            id: id.clone(),
            workflow: workflow.to_owned(),
            tenant: tenant.to_owned(),
            now: None,
            answer: None,
            ended,
        };
        if let Some(existing) = inner.registry.request(tenant, workflow, &id)? {
            if existing.topic != ask.topic || existing.body != ask.body {
                return Err(Refusal::new(
                    409,
                    "conflict",
                    format!(
                        "request `{id}` to workflow `{workflow}` was made with topic `{}` and another body; give \
                         another id for another request",
                        existing.topic
                    ),
                ));
            }
            let waiting = inner.requests.waiting.lock();
            // Read again under the lock the answers' thread takes after its write, so an
            // answer lands either here or in the channel subscribed below.
            let existing = inner.registry.request(tenant, workflow, &id)?.unwrap_or(existing);
            if let Some(answer) = &existing.answer {
                submitted.now = Some(answered(answer));
                return Ok(submitted);
            }
            drop(waiting);
            if submitted.ended.is_none() || record.state != State::Running {
                return Err(unanswered(workflow, &id, Some(record.state).filter(|s| *s != State::Running)));
            }
            submitted.answer = Some(self.subscribe(key));
            return Ok(submitted);
        }
        if record.state != State::Running || submitted.ended.is_none() {
            return Err(Refusal::new(
                409,
                "not_running",
                format!("workflow `{workflow}` has ended ({}); it takes no requests", record.state.as_str()),
            ));
        }
        let root = Pid::from_u64(record.pid);
        let topic = format!("{TOPIC_PREFIX}{id}:{}", ask.topic);
        let body = Payload::json(&ask.body).map_err(|e| Refusal::invalid(format!("body: {e}")))?;
        inner.handle.check_room(root, &topic, &body).map_err(|e| match e {
            SendError::MailboxFull { .. } => Refusal::new(
                429,
                "mailbox_full",
                format!("workflow `{workflow}`'s mailbox is full ({e}); ask again once it has read its messages"),
            ),
            other => Refusal::new(409, "not_running", format!("workflow `{workflow}` takes no requests: {other}")),
        })?;
        let pending_key = (tenant.to_owned(), workflow.to_owned());
        let pending = inner.requests.unanswered.lock().get(&pending_key).copied().unwrap_or(0);
        if pending >= inner.requests.max_pending {
            return Err(Refusal::new(
                429,
                "too_many_requests",
                format!(
                    "workflow `{workflow}` has {pending} requests unanswered, the most it may have (the server's \
                     `--max-pending-requests`); ask again once it has answered some"
                ),
            ));
        }
        let request = RequestRecord {
            id: id.clone(),
            topic: ask.topic,
            body: ask.body,
            asked_ms: now_ms(),
            answer: None,
            answer_key: None,
            answered_ms: None,
        };
        inner.registry.put_request(tenant, workflow, &request)?;
        *inner.requests.unanswered.lock().entry(pending_key).or_default() += 1;
        submitted.answer = Some(self.subscribe(key));
        inner.handle.send(root, topic, body).map_err(|e| match e {
            SendError::NotFound(_) | SendError::Closed(_) => unanswered(workflow, &id, None),
            other => Refusal::internal(&anyhow::anyhow!("cannot deliver request `{id}`: {other}")),
        })?;
        Ok(submitted)
    }

    fn subscribe(&self, key: Key) -> watch::Receiver<Option<Value>> {
        self.inner.requests.waiting.lock().entry(key).or_insert_with(|| watch::channel(None).0).subscribe()
    }

    /// Waits at most `wait` (bounded by the service's `max_wait`) for the answer to a
    /// request [`Service::submit_request`] made.
    ///
    /// # Errors
    ///
    /// The workflow ended without answering (410).
    pub async fn await_answer(&self, submitted: Submitted, wait: Duration) -> Result<Answered, Refusal> {
        let Submitted { id, workflow, tenant, now, answer, ended } = submitted;
        if let Some(now) = now {
            return Ok(now);
        }
        let wait = wait.min(self.inner.config.max_wait);
        let (Some(mut answer), Some(mut ended)) = (answer, ended) else {
            return Err(unanswered(&workflow, &id, None));
        };
        let got = tokio::time::timeout(wait, async {
            tokio::select! {
                got = answer.wait_for(Option::is_some) => got.ok().and_then(|got| got.clone()),
                _ = ended.wait_for(|ended| *ended) => None,
            }
        })
        .await;
        match got {
            Ok(Some(answer)) => Ok(answered(&answer)),
            Err(_elapsed) => Ok(Answered::Pending),
            // The workflow ended: an answer it gave just before is in the registry.
            Ok(None) => match self.inner.registry.request(&tenant, &workflow, &id)?.and_then(|r| r.answer) {
                Some(answer) => Ok(answered(&answer)),
                None => Err(unanswered(&workflow, &id, None)),
            },
        }
    }
}

fn unanswered(workflow: &str, id: &str, state: Option<State>) -> Refusal {
    let how = state.map_or_else(String::new, |state| format!(" ({})", state.as_str()));
    Refusal::new(410, "unanswered", format!("workflow `{workflow}` ended{how} without answering request `{id}`"))
}

/// Forgets the requests of `tenant`'s workflow `workflow`, which is being forgotten.
pub(super) fn forget(registry: &Registry, requests: &Requests, tenant: &str, workflow: &str) -> anyhow::Result<()> {
    requests.ended(None, tenant, workflow);
    registry.remove_requests(tenant, workflow)
}
