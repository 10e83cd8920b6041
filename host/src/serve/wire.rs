//! The API's bodies as types: what the handlers answer, what the OpenAPI document
//! (`GET /v1/openapi.json`, `docs/openapi.json`) describes, and what a client such as
//! the `wasmproc` CLI reads back. Each field's doc comment is its description in the
//! document.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use super::policy::{Grants, Limits, Policy, PolicyFields};
pub use super::registry::State;

/// Every error the API answers, with its HTTP status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// An error: a stable code to match on and a message for people.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ErrorDetail {
    /// A stable code, one of `ErrorCode`'s.
    // Text, so that a client reads a code newer than itself.
    #[schema(value_type = ErrorCode)]
    pub code: String,
    /// What is wrong and, where it helps, how to fix it.
    pub message: String,
}

/// The stable codes of errors, with their statuses: `invalid` (400: a malformed body,
/// query or path; the message names what and where), `unauthorized` (401), `forbidden`,
/// `beyond_policy` (403), `not_found` (404, also for what belongs to another tenant),
/// `method_not_allowed` (405), `conflict`, `not_running`, `running`, `in_use` (409),
/// `unanswered` (410), `too_large`, `quota` (413), `unsupported_media_type` (415),
/// `invalid_component`, `spawn_failed`, `request_failed` (422), `quota`, `rate`,
/// `mailbox_full`, `too_many_requests` (429), `internal` (500).
// A new code is a new variant here: the document lists them, and the API's fuzzing fails
// on a code it does not list.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// 400: a malformed body, query or path, or a value the request may not have.
    Invalid,
    /// 401: no token, an unknown one, or one of the wrong kind.
    Unauthorized,
    /// 403: a tenant's token where the admin's is needed.
    Forbidden,
    /// 403: a grant or a limit past the tenant's policy (the message names it and the
    /// admin's command that would allow it).
    BeyondPolicy,
    /// 404: no such thing, or another tenant's.
    NotFound,
    /// 405: the path takes other methods.
    MethodNotAllowed,
    /// 409: the name or id is taken, or the tenant still has running workflows.
    Conflict,
    /// 409: the workflow has ended (or its mailbox is full).
    NotRunning,
    /// 409: the workflow has not ended.
    Running,
    /// 410: the workflow ended without answering the request.
    Unanswered,
    /// 409: running workflows were started from the component (the message names them).
    InUse,
    /// 413: a body past its bound.
    TooLarge,
    /// 415: a body that says it is not JSON.
    UnsupportedMediaType,
    /// 422: the bytes are not a wasmproc component.
    InvalidComponent,
    /// 422: the scheduler refused the workflow.
    SpawnFailed,
    /// 422: the workflow answered the request with an error.
    RequestFailed,
    /// 429: the tenant runs as many workflows as its policy lets it; 413: an upload past
    /// its storage.
    Quota,
    /// 429: the tenant is past its requests a second.
    Rate,
    /// 429: the workflow's mailbox is full.
    MailboxFull,
    /// 429: the workflow has as many requests unanswered as it may.
    TooManyRequests,
    /// 500: the server failed.
    Internal,
}

/// A tenant's name and bearer token, shown once: only its hash is kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct TenantToken {
    /// The tenant.
    pub name: String,
    /// Its bearer token (`wpt_…`); an older one no longer works.
    pub token: String,
}

/// The tenants.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Tenants {
    /// Each, in name order.
    pub tenants: Vec<TenantPolicy>,
}

/// A tenant and its policy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct TenantPolicy {
    /// The tenant.
    pub name: String,
    /// What its workflows may be granted at most, and its quotas.
    pub policy: Policy,
}

/// What adding a tenant asks for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    /// Its name: 1 to 64 letters, digits, `-`, `_` or `.`.
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    pub name: String,
    /// Its policy: the server's default but for the fields given.
    #[serde(default)]
    pub policy: PolicyFields,
}

/// A deployed component.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Component {
    /// `sha256:<hex>` of its bytes.
    pub hash: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its entry methods.
    pub entries: Vec<String>,
    /// The commands it declares it yields (the SDK's `uses!`), sorted; `null` when it
    /// declares nothing (which is not that it yields nothing).
    pub commands: Option<Vec<String>>,
    /// When the tenant uploaded it, in milliseconds since the Unix epoch.
    pub uploaded_ms: u64,
    /// The names (`NAME`, `NAME:TAG`) the tenant gave it.
    pub names: Vec<String>,
}

/// One component.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ComponentAnswer {
    /// The component.
    pub component: Component,
}

/// The tenant's components.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Components {
    /// Each, by hash.
    pub components: Vec<Component>,
}

/// How a workflow ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It completed, with this result.
    Ok(serde_json::Value),
    /// It failed.
    Error(Ended),
}

/// How a process ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Ended {
    /// `normal`, `error`, `trap`, `killed`, `shutdown`, `terminated`, `noproc` or
    /// `noconnection`.
    pub reason: String,
    /// The reason as text.
    pub message: String,
}

/// A workflow.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Workflow {
    /// Its id, unique within the tenant.
    pub id: String,
    /// Its component's `sha256:<hex>`.
    pub component: String,
    /// Its entry method.
    pub method: String,
    /// Its input, as it was given (`null`: none).
    pub input: Option<serde_json::Value>,
    /// Its root process.
    pub pid: u64,
    /// Where it is in its life.
    pub state: State,
    /// When it was started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// When it ended (`null` while running).
    pub ended_ms: Option<u64>,
    /// Its result once ended (`null` while running).
    pub result: Option<Outcome>,
    /// What it was granted beyond every workflow's defaults.
    pub grants: Grants,
    /// The limits its processes run under.
    pub limits: Limits,
    /// The steps its root process has taken, as its journal holds them (in a workflow's
    /// description, and in a listing with `progress=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// What its root process waits for now, while it runs (in a workflow's description,
    /// and in a listing with `progress=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Vec<Waiting>>,
}

/// One thing a running workflow's root process waits for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Waiting {
    /// `timer` (a sleep, until `until_ms`), `message` (a signal or a request; or an exit
    /// of a process it monitors), `child` (`children` of its processes still running,
    /// whose ends it may wait for), `spawn`, `exit` (of process `pid`, which it
    /// terminates) or `command` (a provider's `command`).
    #[serde(rename = "for")]
    pub what: String,
    /// For a timer: when it fires, in milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// For a command: its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// For an exit: the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u64>,
    /// For a child: how many of its children are running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<u64>,
}

/// One workflow.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct WorkflowAnswer {
    /// The workflow.
    pub workflow: Workflow,
}

/// A page of workflows, in id order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct WorkflowPage {
    /// The workflows.
    pub workflows: Vec<Workflow>,
    /// The id to ask for the next page after (`after=`) when more may follow: the page
    /// is full, or the listing read the 10,000 records one request may read before
    /// filling it (`partial`); `null` when there is no more.
    pub next: Option<String>,
    /// How many records the listing read to answer: those it answers, and those its
    /// filters left out.
    pub examined: u64,
    /// Whether the listing stopped at the 10,000 records one request may read before
    /// it filled the page: more may match after `next`.
    pub partial: bool,
}

/// A workflow's history, as its journal holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct History {
    /// The workflow's root process and every process spawned under it, in pid order.
    pub processes: Vec<ProcessHistory>,
}

/// One process of a workflow's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ProcessHistory {
    /// The process.
    pub pid: u64,
    /// Its spawner (`null` if its spawn record is missing).
    pub parent: Option<u64>,
    /// What it was made from: a component's `sha256:<hex>`, or a built-in kind.
    pub kind: Option<String>,
    /// Its entry method.
    pub method: String,
    /// Steps recorded.
    pub steps: u64,
    /// How it ended (`null` while it runs).
    pub ended: Option<Ended>,
    /// Its journal's records, one line of text each, in order.
    pub records: Vec<String>,
    /// What it waits for, one line each: the commands it yielded that are not
    /// completed yet. Empty once it has ended.
    pub waiting_for: Vec<String>,
}

/// A message for a workflow.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// The message's topic (not empty).
    #[schema(min_length = 1)]
    pub topic: String,
    /// Its body, any JSON (`null` when absent).
    #[serde(default)]
    pub body: serde_json::Value,
}

/// A request for a workflow: a message it answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowRequest {
    /// The request's id (1 to 64 letters, digits, `-`, `_` or `.`): asking again with the
    /// same id never delivers it twice, and gets its answer. Drawn at random when absent
    /// (and not given as the `Idempotency-Key` header).
    #[serde(default)]
    pub id: Option<String>,
    /// The request's topic (not empty).
    pub topic: String,
    /// Its body, any JSON (`null` when absent).
    #[serde(default)]
    pub body: serde_json::Value,
}

/// A request not answered yet.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct RequestPending {
    /// The request.
    pub request: PendingRequest,
}

/// A request and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct PendingRequest {
    /// Its id: ask again with it for the answer.
    pub id: String,
    /// `pending`: delivered (or about to be), not answered yet.
    pub state: String,
}

/// A signal was delivered to the workflow's mailbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Sent {
    /// Always `true`.
    pub sent: bool,
}

/// A cancel was delivered; termination follows after the server's grace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Cancelling {
    /// Always `true`.
    pub cancelled: bool,
}

/// A termination was ordered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Terminated {
    /// Always `true`.
    pub terminated: bool,
}

/// A tenant's workflows counted by state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct WorkflowCounts {
    /// Started and not ended.
    pub running: u64,
    /// Ended normally, with a result.
    pub completed: u64,
    /// Ended otherwise: an error, a trap, a cancel, a termination.
    pub failed: u64,
    /// Whether these are the counts of every workflow selected: always without a
    /// filter; with one, `false` when it selected more than the 10,000 a count reads
    /// (the counts are then of the first 10,000 by id).
    pub exact: bool,
}

/// The host's figures now, as `/metrics` reads them: counters since the server started
/// (a rate is the difference of two readings over their `at_ms`) and levels now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct HostFigures {
    /// When they were read, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Each worker thread of the scheduler, in order.
    pub workers: Vec<WorkerFigures>,
    /// Steps the scheduler has run since the server started, every worker's together.
    pub steps: u64,
    /// Processes waiting in the scheduler's global queue now.
    pub queued: u64,
    /// Processes alive now, every tenant's, workflows' children included.
    pub live: u64,
    /// The most processes alive at once so far.
    pub peak_live: u64,
    /// Processes spawned.
    pub spawned: u64,
    /// Processes ended, by themselves or terminated.
    pub ended: u64,
    /// Messages delivered to mailboxes.
    pub messages: u64,
    /// Times a process about to wait gave its memory back (hibernated).
    pub hibernated: u64,
    /// Processes alive now that are suspended: out of memory until their next event,
    /// counted in `live` (`/metrics`' `wasmproc_processes_suspended`).
    pub suspended: u64,
    /// Commits of the journal since the server started (`null` without one).
    pub commits: Option<u64>,
    /// Records the journal has committed since the server started (`null` without one).
    pub journal_records: Option<u64>,
    /// Bytes of records the journal has committed since the server started (`null` without
    /// one).
    pub journal_bytes: Option<u64>,
    /// The asking tenant's workflows running now.
    pub running: u64,
}

/// One worker thread of the scheduler.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct WorkerFigures {
    /// Steps it has run.
    pub steps: u64,
}
