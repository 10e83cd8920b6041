//! The HTTP API, version 1: JSON in and out, a bearer token on every request but the
//! health checks. Every error is `{"error": {"code": CODE, "message": TEXT}}` with its
//! status; what belongs to another tenant is answered as if it did not exist (404).
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /healthz`, `GET /readyz` | the server is up / takes requests |
//! | `GET /metrics` | (admin) Prometheus' text format: requests, latencies, workflows, steps, commits |
//! | `POST /v1/tenants` `{"name"}` | (admin) adds a tenant; answers its token, shown once |
//! | `GET /v1/tenants` | (admin) the tenants |
//! | `POST /v1/tenants/{name}/token` | (admin) a new token for a tenant; the old one stops working |
//! | `DELETE /v1/tenants/{name}` | (admin) removes a tenant without running workflows |
//! | `POST /v1/components?name=N&tag=T` | uploads a component (the body is its bytes) |
//! | `GET /v1/components`, `GET /v1/components/{ref}` | the tenant's components; one by hash or name |
//! | `POST /v1/workflows` `{"id"?, "component", "method"?, "input"?}` | starts a workflow (201; 200 if the same request started it) |
//! | `GET /v1/workflows?state=&component=&prefix=&after=&limit=` | lists workflows by id, a page at a time |
//! | `GET /v1/workflows/{id}` | describes one |
//! | `GET /v1/workflows/{id}/result?wait=30s` | its result: 200 once ended, 202 while running after the wait |
//! | `GET /v1/workflows/{id}/history` | its journal: each process of it, its records and what it waits for |
//! | `POST /v1/workflows/{id}/signal` `{"topic", "body"?}` | sends it a message |
//! | `POST /v1/workflows/{id}/cancel` | a cancel event, then termination after the grace |
//! | `POST /v1/workflows/{id}/terminate` | ends it at once |
//! | `DELETE /v1/workflows/{id}` | forgets an ended workflow and its history |

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{ComponentRecord, Filter, Refusal, Service, StartRequest, WorkflowRecord};

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(json!({"error": {"code": self.code, "message": self.message}}))).into_response()
    }
}

type Answer = Result<Response, Refusal>;

fn answer(status: StatusCode, body: Value) -> Answer {
    Ok((status, axum::Json(body)).into_response())
}

/// The bearer token of `headers`.
fn token(headers: &HeaderMap) -> Result<&str, Refusal> {
    let unauthorized = |why: &str| Refusal::new(401, "unauthorized", why);
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("no token: send `Authorization: Bearer TOKEN`"))?;
    let value = value.to_str().map_err(|_| unauthorized("the `Authorization` header is not text"))?;
    value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| unauthorized("the `Authorization` header must be `Bearer TOKEN`"))
}

/// The tenant `headers`' token names.
fn tenant(service: &Service, headers: &HeaderMap) -> Result<String, Refusal> {
    let token = token(headers)?;
    let tenant = service.tenant_of(token).ok_or_else(|| {
        let admin = service.is_admin(token);
        let why = if admin { "the admin token manages tenants only; use a tenant's token" } else { "unknown token" };
        Refusal::new(401, "unauthorized", why)
    })?;
    if !service.admit(&tenant) {
        return Err(Refusal::new(
            429,
            "rate",
            format!(
                "tenant `{tenant}` is past its {} requests a second (the server's `--rate`); slow down",
                service.config().rate
            ),
        ));
    }
    Ok(tenant)
}

fn admin(service: &Service, headers: &HeaderMap) -> Result<(), Refusal> {
    if service.is_admin(token(headers)?) {
        Ok(())
    } else {
        Err(Refusal::new(403, "forbidden", "managing tenants takes the admin token"))
    }
}

/// A request of a tenant's: the service, and the tenant its bearer token names (a request
/// past the tenant's rate is refused here).
struct Asker {
    service: Service,
    tenant: String,
}

impl FromRequestParts<Service> for Asker {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, service: &Service) -> Result<Asker, Refusal> {
        Ok(Asker { tenant: tenant(service, &parts.headers)?, service: service.clone() })
    }
}

/// A request with the admin's token: the service.
struct Admin(Service);

impl FromRequestParts<Service> for Admin {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, service: &Service) -> Result<Admin, Refusal> {
        admin(service, &parts.headers)?;
        Ok(Admin(service.clone()))
    }
}

/// The path's one parameter (an id, a name, a reference); a 400 if it cannot be read.
struct Segment(String);

impl FromRequestParts<Service> for Segment {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, service: &Service) -> Result<Segment, Refusal> {
        let Path(segment) = Path::<String>::from_request_parts(parts, service)
            .await
            .map_err(|e| Refusal::invalid(format!("invalid path: {}", e.body_text())))?;
        Ok(Segment(segment))
    }
}

/// `body` as JSON of shape `T`; a 400 naming the line and column of what is wrong.
fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body).map_err(|e| Refusal::invalid(format!("invalid JSON body: {e}")))
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Refusal> {
    query.map(|Query(q)| q).map_err(|e| Refusal::invalid(format!("invalid query: {}", e.body_text())))
}

/// Runs `work` on a thread that may block (synced writes, compiling a component).
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, Refusal> + Send + 'static) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Refusal::internal(&anyhow::anyhow!("a request's work failed: {e}"))))
}

fn component_json((record, names): &(ComponentRecord, Vec<String>)) -> Value {
    json!({
        "hash": record.hash,
        "size": record.size,
        "entries": record.entries,
        "uploaded_ms": record.uploaded_ms,
        "names": names,
    })
}

fn workflow_json(record: &WorkflowRecord) -> Value {
    json!({
        "id": record.id,
        "component": record.component,
        "method": record.method,
        "input": record.input,
        "pid": record.pid,
        "state": record.state.as_str(),
        "started_ms": record.started_ms,
        "ended_ms": record.ended_ms,
        "result": record.result,
    })
}

/// The router of the API over `service`.
pub(super) fn router(service: Service) -> Router {
    let upload = DefaultBodyLimit::max(service.config().max_upload);
    let body = DefaultBodyLimit::max(service.config().max_body);
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async { "ready\n" }))
        .route("/v1/tenants", post(add_tenant).get(list_tenants).layer(body))
        .route("/v1/tenants/{name}", axum::routing::delete(remove_tenant))
        .route("/v1/tenants/{name}/token", post(new_token))
        .route("/v1/components", post(deploy).get(list_components).layer(upload))
        .route("/v1/components/{reference}", get(describe_component))
        .route("/v1/workflows", post(start).get(list_workflows).layer(body))
        .route("/v1/workflows/{id}", get(describe_workflow).delete(forget))
        .route("/v1/workflows/{id}/result", get(result))
        .route("/v1/workflows/{id}/history", get(history))
        .route("/v1/workflows/{id}/signal", post(signal).layer(body))
        .route("/v1/workflows/{id}/cancel", post(cancel))
        .route("/v1/workflows/{id}/terminate", post(terminate))
        .route("/metrics", get(scrape_metrics))
        .route_layer(axum::middleware::from_fn_with_state(service.clone(), super::metrics::measure))
        .fallback(|| async { Refusal::not_found("such endpoint: see the API's table in README.md") })
        .method_not_allowed_fallback(|| async {
            Refusal::new(405, "method_not_allowed", "this path takes another method")
        })
        .with_state(service)
}

async fn scrape_metrics(Admin(service): Admin) -> Answer {
    Ok(super::metrics::scrape(State(service)).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    name: String,
}

async fn add_tenant(Admin(service): Admin, body: Bytes) -> Answer {
    let NewTenant { name } = json_body(&body)?;
    let token = blocking({
        let (service, name) = (service.clone(), name.clone());
        move || service.add_tenant(&name)
    })
    .await?;
    answer(StatusCode::CREATED, json!({"name": name, "token": token}))
}

async fn list_tenants(Admin(service): Admin) -> Answer {
    answer(StatusCode::OK, json!({"tenants": service.tenants()?}))
}

async fn remove_tenant(Admin(service): Admin, Segment(name): Segment) -> Answer {
    blocking(move || service.remove_tenant(&name)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn new_token(Admin(service): Admin, Segment(name): Segment) -> Answer {
    let token = blocking({
        let (service, name) = (service.clone(), name.clone());
        move || service.new_token(&name)
    })
    .await?;
    answer(StatusCode::OK, json!({"name": name, "token": token}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Naming {
    name: Option<String>,
    tag: Option<String>,
}

async fn deploy(
    Asker { service, tenant }: Asker,
    naming: Result<Query<Naming>, QueryRejection>,
    body: Bytes,
) -> Answer {
    let naming = query(naming)?;
    let (service2, tenant2) = (service.clone(), tenant.clone());
    let (record, new) =
        blocking(move || service2.deploy(&tenant2, &body, naming.name.as_deref(), naming.tag.as_deref())).await?;
    let names = service.component(&tenant, &record.hash)?.1;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    answer(status, json!({"component": component_json(&(record, names))}))
}

async fn list_components(Asker { service, tenant }: Asker) -> Answer {
    let components: Vec<Value> = service.components(&tenant)?.iter().map(component_json).collect();
    answer(StatusCode::OK, json!({"components": components}))
}

async fn describe_component(Asker { service, tenant }: Asker, Segment(reference): Segment) -> Answer {
    let component = service.component(&tenant, &reference)?;
    answer(StatusCode::OK, json!({"component": component_json(&component)}))
}

async fn start(Asker { service, tenant }: Asker, body: Bytes) -> Answer {
    let request: StartRequest = json_body(&body)?;
    let (record, new) = blocking(move || service.start(&tenant, request)).await?;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    answer(status, json!({"workflow": workflow_json(&record)}))
}

async fn list_workflows(Asker { service, tenant }: Asker, filter: Result<Query<Filter>, QueryRejection>) -> Answer {
    let filter = query(filter)?;
    let limit = filter.page_size();
    let found = service.workflows(&tenant, &filter)?;
    // A full page may have more after it: its last id is where the next page starts.
    let next = (found.len() == limit).then(|| found.last().map(|w| w.id.clone())).flatten();
    let workflows: Vec<Value> = found.iter().map(workflow_json).collect();
    answer(StatusCode::OK, json!({"workflows": workflows, "next": next}))
}

async fn describe_workflow(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    answer(StatusCode::OK, json!({"workflow": workflow_json(&service.workflow(&tenant, &id)?)}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wait {
    wait: Option<String>,
}

async fn result(
    Asker { service, tenant }: Asker,
    Segment(id): Segment,
    wait: Result<Query<Wait>, QueryRejection>,
) -> Answer {
    let wait = match query(wait)?.wait {
        Some(text) => humantime::parse_duration(&text)
            .map_err(|e| Refusal::invalid(format!("invalid `wait` `{text}` ({e}): a duration such as `30s`")))?,
        None => Duration::ZERO,
    };
    let record = service.wait(&tenant, &id, wait).await?;
    let status = if record.result.is_some() { StatusCode::OK } else { StatusCode::ACCEPTED };
    answer(status, json!({"workflow": workflow_json(&record)}))
}

async fn history(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    let processes = blocking(move || service.history(&tenant, &id)).await?;
    let processes: Vec<Value> = processes
        .iter()
        .map(|h| {
            json!({
                "pid": h.pid.as_u64(),
                "parent": h.parent.map(|p| p.as_u64()),
                // The kind without its tenant: the component's hash, or a built-in kind.
                "kind": h.kind.as_deref().map(|k| k.split_once('/').map_or(k, |(_, hash)| hash)),
                "method": h.method,
                "steps": h.steps,
                "ended": h.result.as_ref().map(|e| json!({"reason": e.reason.name(), "message": e.reason.to_string()})),
                "records": h.records,
                "waiting_for": h.waiting_for,
            })
        })
        .collect();
    answer(StatusCode::OK, json!({"processes": processes}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Signal {
    topic: String,
    #[serde(default)]
    body: Value,
}

async fn signal(Asker { service, tenant }: Asker, Segment(id): Segment, body: Bytes) -> Answer {
    let Signal { topic, body } = json_body(&body)?;
    if topic.is_empty() {
        return Err(Refusal::invalid("`topic` must not be empty"));
    }
    service.signal(&tenant, &id, &topic, &body)?;
    answer(StatusCode::ACCEPTED, json!({"sent": true}))
}

async fn cancel(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    service.cancel(&tenant, &id)?;
    answer(StatusCode::ACCEPTED, json!({"cancelled": true}))
}

async fn terminate(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    service.terminate(&tenant, &id)?;
    answer(StatusCode::ACCEPTED, json!({"terminated": true}))
}

async fn forget(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    blocking(move || service.forget(&tenant, &id)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
