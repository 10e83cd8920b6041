//! The HTTP API, version 1: JSON in and out, a bearer token on every request but the
//! health checks and the API's document. Every error is `{"error": {"code": CODE,
//! "message": TEXT}}` with its status; what belongs to another tenant is answered as if
//! it did not exist (404). A grant or a limit beyond the tenant's policy is `403
//! beyond_policy`; a quota reached is `429 quota` (running workflows) or `413 quota`
//! (storage); a rate passed `429 rate`.
//!
//! Each handler carries its `#[utoipa::path]` (method, path, parameters, body, every
//! status it answers) and is routed through `routes!`, which takes the path from that
//! annotation: the OpenAPI document ([`openapi`], `GET /v1/openapi.json`,
//! `docs/openapi.json`) is made from the routes themselves, so a route cannot be served
//! without being described.
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /healthz`, `GET /readyz` | the server is up / takes requests |
//! | `GET /metrics` | (admin) Prometheus' text format: requests, latencies, workflows, steps, commits |
//! | `GET /v1/openapi.json` | the API's OpenAPI 3.1 document |
//! | `POST /v1/tenants` `{"name", "policy"?}` | (admin) adds a tenant; answers its token, shown once |
//! | `GET /v1/tenants` | (admin) the tenants, with their policies |
//! | `GET`, `PUT /v1/tenants/{name}/policy` | (admin) a tenant's policy; `PUT` sets it (fields left out: the server's default) |
//! | `POST /v1/tenants/{name}/token` | (admin) a new token for a tenant; the old one stops working |
//! | `DELETE /v1/tenants/{name}` | (admin) removes a tenant without running workflows, and its key-value data |
//! | `POST /v1/components?name=N&tag=T` | uploads a component (the body is its bytes) |
//! | `GET /v1/components`, `GET /v1/components/{reference}` | the tenant's components; one by hash or name |
//! | `DELETE /v1/components/{reference}` | removes a component no running workflow was started from |
//! | `POST /v1/workflows` `{"id"?, "component", "method"?, "input"?, "grants"?, "limits"?}` | starts a workflow (201; 200 if the same request started it) |
//! | `GET /v1/workflows?state=&component=&prefix=&after=&limit=` | lists workflows by id, a page at a time |
//! | `GET /v1/workflows/{id}` | describes one: with its steps and, while it runs, what it waits for |
//! | `GET /v1/workflows/{id}/result?wait=30s` | its result: 200 once ended, 202 while running after the wait |
//! | `GET /v1/workflows/{id}/history` | its journal: each process of it, its records and what it waits for |
//! | `POST /v1/workflows/{id}/signal` `{"topic", "body"?}` | sends it a message |
//! | `POST /v1/workflows/{id}/request?timeout=30s` `{"id"?, "topic", "body"?}` | a message it answers: 200 with the answer as the body; 202 while unanswered after the wait (ask again with the same id); 410 if it ended without answering; 422 if it answered with an error |
//! | `GET /v1/workflows/{id}/logs?follow=true` | its log, newline-delimited JSON; `follow` streams new lines until it ends |
//! | `POST /v1/workflows/{id}/cancel` | a cancel event, then termination after the grace |
//! | `POST /v1/workflows/{id}/terminate` | ends it at once |
//! | `DELETE /v1/workflows/{id}` | forgets an ended workflow and its history |
//! | `GET /v1/workflow-counts?component=&prefix=` | the tenant's workflows counted by state |
//! | `GET /v1/host` | the host's figures: workers, steps, processes, journal (as `/metrics`) |
//! | `GET /ui` | the console, a page over this API (see [`console`]) |

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, IntoResponses, OpenApi};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt as _};
use utoipa_axum::routes;

use super::wire::{
    Cancelling, Component, ComponentAnswer, Components, Ended, ErrorBody, ErrorDetail, History, NewTenant, Outcome,
    PendingRequest, ProcessHistory, RequestPending, Sent, SignalRequest, TenantPolicy, TenantToken, Tenants,
    Terminated, Workflow, WorkflowAnswer, WorkflowPage, WorkflowRequest,
};
mod console;

use super::{
    Answered, ComponentRecord, Filter, Listing, PolicyFields, Refusal, Service, ServiceConfig, StartRequest,
    WorkflowRecord, blocking,
};

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody { error: ErrorDetail { code: self.code.to_owned(), message: self.message } };
        (status, Json(body)).into_response()
    }
}

type Answer = Result<Response, Refusal>;

fn answer(status: StatusCode, body: impl serde::Serialize) -> Answer {
    Ok((status, Json(body)).into_response())
}

/// The API's description, beside what the routes' annotations add.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "wasmproc",
        description = "The HTTP API of `wasmproc serve`: tenants deploy components and start, watch and control \
                       durable workflows. Every request but the health checks and this document carries a bearer \
                       token: a tenant's, or for `/v1/tenants` and `/metrics` the admin's (`DATA/admin.token`). \
                       Every error is `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "Apache-2.0 WITH LLVM-exception", identifier = "Apache-2.0 WITH LLVM-exception"),
    ),
    modifiers(&BearerScheme),
    components(schemas(ErrorBody)),
    tags(
        (name = "operations", description = "Health, metrics and this document"),
        (name = "tenants", description = "Tenants, their policies and their tokens (the admin's token)"),
        (name = "components", description = "A tenant's deployed components"),
        (name = "workflows", description = "A tenant's workflows"),
        (name = "console", description = "The console's page and files (they hold no data: the page reads this \
            API with the token it is given)"),
    ),
)]
struct ApiDoc;

/// The `bearer` security scheme every protected route names.
struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("A tenant's token (`wpt_…`), or the admin's (`wpa_…`) for the admin's routes"))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// What any request with a tenant's token may be refused with.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "never built: it only documents the statuses every tenant's route may answer")]
enum AsTenant {
    /// `unauthorized`: no token, an unknown one, or the admin's.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// `rate`: the tenant is past its requests a second (its policy's `rate`).
    #[response(status = 429)]
    Rate(ErrorBody),
    /// `internal`: the server failed.
    #[response(status = 500)]
    Internal(ErrorBody),
}

/// What any request of the admin's may be refused with.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "never built: it only documents the statuses every admin's route may answer")]
enum AsAdmin {
    /// `unauthorized`: no token, or not a bearer token.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// `forbidden`: a token that is not the admin's.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// `internal`: the server failed.
    #[response(status = 500)]
    Internal(ErrorBody),
}

/// What any request with a JSON body may be refused with, beside a malformed body (400).
#[derive(IntoResponses)]
#[expect(dead_code, reason = "never built: it only documents the statuses every JSON body may get")]
enum WithJson {
    /// `too_large`: a body past the server's bound for a request.
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// `unsupported_media_type`: a `Content-Type` other than `application/json`.
    #[response(status = 415)]
    UnsupportedMediaType(ErrorBody),
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
                "tenant `{tenant}` is past its {} requests a second (its policy's `rate`); slow down, or have the admin \
                 run `wasmproc tenant policy {tenant} --rate N`",
                service.policy(&tenant).map_or(0, |policy| policy.rate)
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

/// The request's body as bytes, within the route's bound: a 413 naming `bound` past it.
async fn bytes(request: Request, service: &Service, bound: usize, flag: &str) -> Result<Bytes, Refusal> {
    Bytes::from_request(request, service).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Refusal::new(413, "too_large", format!("the body is over {bound} bytes, the most this server takes{flag}"))
        } else {
            Refusal::invalid(format!("cannot read the body: {}", rejection.body_text()))
        }
    })
}

/// A JSON body of shape `T`: at most the server's bound for a request body (413 past
/// it), `application/json` if it says what it is (415 otherwise; a body that does not
/// say is read as JSON), and well-formed (400 naming the line and column of what is
/// wrong).
struct JsonBody<T>(T);

impl<T: DeserializeOwned> FromRequest<Service> for JsonBody<T> {
    type Rejection = Refusal;

    async fn from_request(request: Request, service: &Service) -> Result<JsonBody<T>, Refusal> {
        if let Some(kind) = request.headers().get(header::CONTENT_TYPE) {
            let text = kind.to_str().unwrap_or("?");
            let essence = text.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            if essence != "application/json" && !essence.ends_with("+json") {
                return Err(Refusal::new(
                    415,
                    "unsupported_media_type",
                    format!("the body is `{text}`; send JSON, as `Content-Type: application/json`"),
                ));
            }
        }
        let body = bytes(request, service, service.config().max_body, "").await?;
        serde_json::from_slice(&body).map(JsonBody).map_err(|e| Refusal::invalid(format!("invalid JSON body: {e}")))
    }
}

/// A component's bytes: at most the server's bound for an upload (413 past it).
struct Upload(Bytes);

impl FromRequest<Service> for Upload {
    type Rejection = Refusal;

    async fn from_request(request: Request, service: &Service) -> Result<Upload, Refusal> {
        let bound = service.config().max_upload;
        Ok(Upload(bytes(request, service, bound, " for a component (the server's `--max-upload`)").await?))
    }
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Refusal> {
    query.map(|Query(q)| q).map_err(|e| Refusal::invalid(format!("invalid query: {}", e.body_text())))
}

fn component_view((record, names): (ComponentRecord, Vec<String>)) -> Component {
    Component {
        hash: record.hash,
        size: record.size,
        entries: record.entries,
        commands: record.commands,
        uploaded_ms: record.uploaded_ms,
        names,
    }
}

fn workflow_view(record: WorkflowRecord) -> Result<Workflow, Refusal> {
    let result = record
        .result
        .map(serde_json::from_value::<Outcome>)
        .transpose()
        .map_err(|e| Refusal::internal(&anyhow::anyhow!("workflow `{}` has a damaged result: {e}", record.id)))?;
    Ok(Workflow {
        id: record.id,
        component: record.component,
        method: record.method,
        input: record.input,
        pid: record.pid,
        state: record.state,
        started_ms: record.started_ms,
        ended_ms: record.ended_ms,
        result,
        grants: record.grants,
        limits: record.limits,
        steps: None,
        waiting: None,
    })
}

/// The routes, each with its part of the document; `limits` bound the bodies (a
/// request's, an upload's).
fn routes(limits: &ServiceConfig) -> OpenApiRouter<Service> {
    let upload = DefaultBodyLimit::max(limits.max_upload);
    let body = DefaultBodyLimit::max(limits.max_body);
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(scrape_metrics))
        .routes(routes!(openapi_json))
        .routes(routes!(add_tenant, list_tenants).layer(body))
        .routes(routes!(remove_tenant))
        .routes(routes!(get_policy, put_policy).layer(body))
        .routes(routes!(new_token))
        .routes(routes!(deploy, list_components).layer(upload))
        .routes(routes!(describe_component, remove_component))
        .routes(routes!(start, list_workflows).layer(body))
        .routes(routes!(describe_workflow, forget))
        .routes(routes!(result))
        .routes(routes!(history))
        .routes(routes!(signal).layer(body))
        .routes(routes!(request).layer(body))
        .routes(routes!(logs))
        .routes(routes!(cancel))
        .routes(routes!(terminate))
        .routes(routes!(console::counts))
        .routes(routes!(console::host))
        .routes(routes!(console::page))
        .routes(routes!(console::file))
}

/// The API's OpenAPI 3.1 document, as `GET /v1/openapi.json` serves it.
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes(&ServiceConfig::new("")).into_openapi()
}

/// The router of the API over `service`.
pub(super) fn router(service: Service) -> Router {
    let (router, _) = routes(service.config()).split_for_parts();
    router
        .route_layer(axum::middleware::from_fn_with_state(service.clone(), super::metrics::measure))
        .fallback(|| async { Refusal::not_found("such endpoint: see `GET /v1/openapi.json`") })
        .method_not_allowed_fallback(|| async {
            Refusal::new(405, "method_not_allowed", "this path takes another method: see `GET /v1/openapi.json`")
        })
        .with_state(service)
}

/// The server is up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "`ok`", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok\n"
}

/// The server takes requests.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "`ready`", body = String, content_type = "text/plain")))]
async fn readyz() -> &'static str {
    "ready\n"
}

/// The server's metrics, in Prometheus' text format: requests and latencies by route,
/// workflows by state and tenant, the scheduler's steps and the journal's commits.
#[utoipa::path(get, path = "/metrics", tag = "operations", security(("bearer" = [])),
    responses(
        (status = 200, description = "The metrics", body = String, content_type = "application/openmetrics-text"),
        AsAdmin,
    ))]
async fn scrape_metrics(Admin(service): Admin) -> Answer {
    Ok(super::metrics::scrape(State(service)).await)
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "operations",
    responses(
        (status = 200, description = "The API's OpenAPI 3.1 document", body = serde_json::Value),
        (status = 500, description = "`internal`: the server failed", body = ErrorBody),
    ))]
async fn openapi_json() -> Answer {
    static DOCUMENT: OnceLock<Result<String, String>> = OnceLock::new();
    let document = DOCUMENT.get_or_init(|| openapi().to_pretty_json().map_err(|e| e.to_string()));
    match document {
        Ok(text) => Ok(([(header::CONTENT_TYPE, "application/json")], text.clone()).into_response()),
        Err(error) => Err(Refusal::internal(&anyhow::anyhow!("cannot write the OpenAPI document: {error}"))),
    }
}

/// Adds a tenant; its token is in the answer only.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", security(("bearer" = [])),
    request_body = NewTenant,
    responses(
        (status = 201, description = "Added", body = TenantToken),
        (status = 400, description = "`invalid`: malformed JSON, an invalid name, or a policy the server cannot \
            hold", body = ErrorBody),
        (status = 409, description = "`conflict`: the name is taken", body = ErrorBody),
        WithJson,
        AsAdmin,
    ))]
async fn add_tenant(Admin(service): Admin, JsonBody(NewTenant { name, policy }): JsonBody<NewTenant>) -> Answer {
    let token = blocking({
        let (service, name) = (service.clone(), name.clone());
        move || service.add_tenant(&name, policy)
    })
    .await?;
    answer(StatusCode::CREATED, TenantToken { name, token })
}

/// The tenants, with their policies.
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", security(("bearer" = [])),
    responses((status = 200, description = "The tenants, by name", body = Tenants), AsAdmin))]
async fn list_tenants(Admin(service): Admin) -> Answer {
    let tenants = service.tenants()?.into_iter().map(|(name, policy)| TenantPolicy { name, policy }).collect();
    answer(StatusCode::OK, Tenants { tenants })
}

/// A tenant's policy: what its workflows may be granted at most, and its quotas.
#[utoipa::path(get, path = "/v1/tenants/{name}/policy", tag = "tenants", security(("bearer" = [])),
    params(("name" = String, Path, description = "The tenant")),
    responses(
        (status = 200, description = "Its policy", body = TenantPolicy),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: no such tenant", body = ErrorBody),
        AsAdmin,
    ))]
async fn get_policy(Admin(service): Admin, Segment(name): Segment) -> Answer {
    let policy = service.policy(&name)?;
    answer(StatusCode::OK, TenantPolicy { name, policy })
}

/// Sets a tenant's policy: the server's default but for the fields given. Its workflows
/// started before keep what they were started with.
#[utoipa::path(put, path = "/v1/tenants/{name}/policy", tag = "tenants", security(("bearer" = [])),
    params(("name" = String, Path, description = "The tenant")),
    request_body = PolicyFields,
    responses(
        (status = 200, description = "Its policy now", body = TenantPolicy),
        (status = 400, description = "`invalid`: an unreadable path, malformed JSON, or a policy the server cannot \
            hold (memory past its `--memory`, a rate of 0, a command that is not over other processes)",
            body = ErrorBody),
        (status = 404, description = "`not_found`: no such tenant", body = ErrorBody),
        WithJson,
        AsAdmin,
    ))]
async fn put_policy(Admin(service): Admin, Segment(name): Segment, JsonBody(fields): JsonBody<PolicyFields>) -> Answer {
    let policy = blocking({
        let (service, name) = (service.clone(), name.clone());
        move || service.set_policy(&name, fields)
    })
    .await?;
    answer(StatusCode::OK, TenantPolicy { name, policy })
}

/// Removes a tenant that has no running workflow.
#[utoipa::path(delete, path = "/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = String, Path, description = "The tenant")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: no such tenant", body = ErrorBody),
        (status = 409, description = "`conflict`: it has running workflows", body = ErrorBody),
        AsAdmin,
    ))]
async fn remove_tenant(Admin(service): Admin, Segment(name): Segment) -> Answer {
    blocking(move || service.remove_tenant(&name)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A new token for a tenant; the old one stops working.
#[utoipa::path(post, path = "/v1/tenants/{name}/token", tag = "tenants", security(("bearer" = [])),
    params(("name" = String, Path, description = "The tenant")),
    responses(
        (status = 200, description = "Its new token", body = TenantToken),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: no such tenant", body = ErrorBody),
        AsAdmin,
    ))]
async fn new_token(Admin(service): Admin, Segment(name): Segment) -> Answer {
    let token = blocking({
        let (service, name) = (service.clone(), name.clone());
        move || service.new_token(&name)
    })
    .await?;
    answer(StatusCode::OK, TenantToken { name, token })
}

/// How an upload names its component.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Naming {
    /// A name to start it by: 1 to 64 letters, digits, `-`, `_` or `.`.
    #[param(pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    name: Option<String>,
    /// A tag for the name (`NAME:TAG`), of the same letters; takes `name`.
    #[param(pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    tag: Option<String>,
}

/// Uploads a component: validated, compiled once, and kept by the SHA-256 of its bytes.
#[utoipa::path(post, path = "/v1/components", tag = "components", security(("bearer" = [])),
    params(Naming),
    request_body(content = Vec<u8>, description = "The component's bytes (a `process` world component)",
        content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "Deployed", body = ComponentAnswer),
        (status = 200, description = "The tenant had deployed it already", body = ComponentAnswer),
        (status = 400, description = "`invalid`: an invalid name or tag, or a tag without a name", body = ErrorBody),
        (status = 413, description = "`too_large`: past the server's `--max-upload`; `quota`: past the tenant's \
            `storage` with its components and key-value data", body = ErrorBody),
        (status = 422, description = "`invalid_component`: not a wasmproc component", body = ErrorBody),
        AsTenant,
    ))]
async fn deploy(
    Asker { service, tenant }: Asker,
    naming: Result<Query<Naming>, QueryRejection>,
    Upload(body): Upload,
) -> Answer {
    let naming = query(naming)?;
    let (service2, tenant2) = (service.clone(), tenant.clone());
    let (record, new) =
        blocking(move || service2.deploy(&tenant2, &body, naming.name.as_deref(), naming.tag.as_deref())).await?;
    let names = service.component(&tenant, &record.hash)?.1;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    answer(status, ComponentAnswer { component: component_view((record, names)) })
}

/// The tenant's components.
#[utoipa::path(get, path = "/v1/components", tag = "components", security(("bearer" = [])),
    responses((status = 200, description = "Its components, by hash", body = Components), AsTenant))]
async fn list_components(Asker { service, tenant }: Asker) -> Answer {
    let components = service.components(&tenant)?.into_iter().map(component_view).collect();
    answer(StatusCode::OK, Components { components })
}

/// One of the tenant's components.
#[utoipa::path(get, path = "/v1/components/{reference}", tag = "components", security(("bearer" = [])),
    params(("reference" = String, Path, description = "`sha256:<hex>`, `NAME` or `NAME:TAG`")),
    responses(
        (status = 200, description = "The component", body = ComponentAnswer),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such component", body = ErrorBody),
        AsTenant,
    ))]
async fn describe_component(Asker { service, tenant }: Asker, Segment(reference): Segment) -> Answer {
    let component = service.component(&tenant, &reference)?;
    answer(StatusCode::OK, ComponentAnswer { component: component_view(component) })
}

/// Removes one of the tenant's components and its names, once no running workflow was
/// started from it.
#[utoipa::path(delete, path = "/v1/components/{reference}", tag = "components", security(("bearer" = [])),
    params(("reference" = String, Path, description = "`sha256:<hex>`, `NAME` or `NAME:TAG`")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such component", body = ErrorBody),
        (status = 409, description = "`in_use`: running workflows were started from it (the message names them)",
            body = ErrorBody),
        AsTenant,
    ))]
async fn remove_component(Asker { service, tenant }: Asker, Segment(reference): Segment) -> Answer {
    blocking(move || service.remove_component(&tenant, &reference)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Starts a workflow; idempotent by its id.
#[utoipa::path(post, path = "/v1/workflows", tag = "workflows", security(("bearer" = [])),
    request_body = StartRequest,
    // The sets first: this route's own 429 describes more than theirs.
    responses(
        AsTenant,
        WithJson,
        (status = 201, description = "Started", body = WorkflowAnswer),
        (status = 200, description = "The same request started it before: that workflow", body = WorkflowAnswer),
        (status = 400, description = "`invalid`: malformed JSON, an invalid id, an unknown method, an input that \
            is not a payload, a grant that names no built-in command", body = ErrorBody),
        (status = 403, description = "`beyond_policy`: a grant or a limit past the tenant's policy (the message \
            names it and the admin's fix)", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such component", body = ErrorBody),
        (status = 409, description = "`conflict`: the id is taken by another request", body = ErrorBody),
        (status = 422, description = "`spawn_failed`: the scheduler refused the workflow", body = ErrorBody),
        (status = 429, description = "`quota`: the tenant runs as many workflows as it may (its policy's \
            `max_running`); `rate`: past its requests a second", body = ErrorBody),
    ))]
async fn start(Asker { service, tenant }: Asker, JsonBody(request): JsonBody<StartRequest>) -> Answer {
    let (record, new) = service.start_async(&tenant, request).await?;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    answer(status, WorkflowAnswer { workflow: workflow_view(record)? })
}

/// The tenant's workflows, by id, a page at a time.
///
/// A page starts after the `after` given (the previous page's `next`) and reads the
/// workflows in id order, applying the filters as it reads: `prefix` is a range of
/// ids, read alone. One request reads at most 10,000 workflows: a filter that few
/// match may answer fewer than `limit` with `partial` and a `next` to go on from.
#[utoipa::path(get, path = "/v1/workflows", tag = "workflows", security(("bearer" = [])),
    params(Filter),
    responses(
        (status = 200, description = "A page of workflows", body = WorkflowPage),
        (status = 400, description = "`invalid`: an unreadable query, or a `limit` of 0 or over 1,000", body = ErrorBody),
        AsTenant,
    ))]
async fn list_workflows(Asker { service, tenant }: Asker, filter: Result<Query<Filter>, QueryRejection>) -> Answer {
    let filter = query(filter)?;
    let limit = filter.page_size()?;
    let progress = filter.progress.unwrap_or(false);
    let found = blocking(move || {
        let found = service.workflows(&tenant, &filter)?;
        let progress = if progress {
            found.workflows.iter().map(|w| service.progress(w)).collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        Ok((found, progress))
    });
    let (Listing { workflows: found, examined, next }, progress) = found.await?;
    let partial = next.is_some() && found.len() < limit;
    let mut workflows = found.into_iter().map(workflow_view).collect::<Result<Vec<_>, _>>()?;
    for (workflow, progress) in workflows.iter_mut().zip(progress) {
        if let Some(progress) = progress {
            workflow.steps = Some(progress.steps);
            workflow.waiting = progress.waiting;
        }
    }
    answer(StatusCode::OK, WorkflowPage { workflows, next, examined: examined as u64, partial })
}

/// One of the tenant's workflows.
#[utoipa::path(get, path = "/v1/workflows/{id}", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id")),
    responses(
        (status = 200, description = "The workflow", body = WorkflowAnswer),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        AsTenant,
    ))]
async fn describe_workflow(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    let (record, progress) = blocking(move || {
        let record = service.workflow(&tenant, &id)?;
        let progress = service.progress(&record)?;
        Ok((record, progress))
    })
    .await?;
    let mut workflow = workflow_view(record)?;
    if let Some(progress) = progress {
        workflow.steps = Some(progress.steps);
        workflow.waiting = progress.waiting;
    }
    answer(StatusCode::OK, WorkflowAnswer { workflow })
}

/// How long a request for a result waits.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Wait {
    /// Wait at most this long for the workflow to end (`30s`, `500ms`; the server bounds
    /// it at 60 s); no wait when absent.
    wait: Option<String>,
}

/// A workflow's result, waiting for it if asked.
#[utoipa::path(get, path = "/v1/workflows/{id}/result", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id"), Wait),
    responses(
        (status = 200, description = "It has ended: its result is in `result`", body = WorkflowAnswer),
        (status = 202, description = "It is still running after the wait", body = WorkflowAnswer),
        (status = 400, description = "`invalid`: an unreadable path, or a `wait` that is no duration",
            body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        AsTenant,
    ))]
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
    answer(status, WorkflowAnswer { workflow: workflow_view(record)? })
}

/// A workflow's history: each of its processes, its journal's records, and what it
/// waits for.
#[utoipa::path(get, path = "/v1/workflows/{id}/history", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id")),
    responses(
        (status = 200, description = "Its history", body = History),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        AsTenant,
    ))]
async fn history(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    let processes = blocking(move || service.history(&tenant, &id)).await?;
    let processes = processes
        .into_iter()
        .map(|h| ProcessHistory {
            pid: h.pid.as_u64(),
            parent: h.parent.map(|p| p.as_u64()),
            // The kind without its tenant and workflow: the component's hash, or a
            // built-in kind.
            kind: h.kind.map(|k| {
                let hash = k.split_once('/').map_or(k.as_str(), |(_, hash)| hash);
                hash.split_once('@').map_or(hash, |(hash, _)| hash).to_owned()
            }),
            method: h.method,
            steps: h.steps,
            ended: h.result.map(|e| Ended { reason: e.reason.name().to_owned(), message: e.reason.to_string() }),
            records: h.records,
            waiting_for: h.waiting_for,
        })
        .collect();
    answer(StatusCode::OK, History { processes })
}

/// Sends a workflow a message on a topic.
#[utoipa::path(post, path = "/v1/workflows/{id}/signal", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id")),
    request_body = SignalRequest,
    responses(
        (status = 202, description = "In its mailbox", body = Sent),
        (status = 400, description = "`invalid`: an unreadable path, malformed JSON, an empty topic, or one \
            beginning with `wasmproc:`", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        (status = 409, description = "`not_running`: it has ended, or its mailbox is full", body = ErrorBody),
        WithJson,
        AsTenant,
    ))]
async fn signal(
    Asker { service, tenant }: Asker,
    Segment(id): Segment,
    JsonBody(SignalRequest { topic, body }): JsonBody<SignalRequest>,
) -> Answer {
    if topic.is_empty() {
        return Err(Refusal::invalid("`topic` must not be empty"));
    }
    service.signal(&tenant, &id, &topic, &body)?;
    answer(StatusCode::ACCEPTED, Sent { sent: true })
}

/// Cancels a workflow: a cancel event now, and termination if it has not ended after
/// the server's grace.
#[utoipa::path(post, path = "/v1/workflows/{id}/cancel", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id")),
    responses(
        (status = 202, description = "Cancelling", body = Cancelling),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        (status = 409, description = "`not_running`: it has ended", body = ErrorBody),
        AsTenant,
    ))]
async fn cancel(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    service.cancel(&tenant, &id)?;
    answer(StatusCode::ACCEPTED, Cancelling { cancelled: true })
}

/// Terminates a workflow at once.
#[utoipa::path(post, path = "/v1/workflows/{id}/terminate", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id")),
    responses(
        (status = 202, description = "Terminated", body = Terminated),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        (status = 409, description = "`not_running`: it has ended", body = ErrorBody),
        AsTenant,
    ))]
async fn terminate(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    service.terminate(&tenant, &id)?;
    answer(StatusCode::ACCEPTED, Terminated { terminated: true })
}

/// Forgets an ended workflow: its record, its result and its history.
#[utoipa::path(delete, path = "/v1/workflows/{id}", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id")),
    responses(
        (status = 204, description = "Forgotten"),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        (status = 409, description = "`running`: it has not ended; cancel it first", body = ErrorBody),
        AsTenant,
    ))]
async fn forget(Asker { service, tenant }: Asker, Segment(id): Segment) -> Answer {
    blocking(move || service.forget(&tenant, &id)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct RequestQuery {
    /// Wait at most this long for the answer (`30s`, `500ms`; the server bounds it at
    /// 60 s); 30 s when absent.
    timeout: Option<String>,
}

/// The header that carries a request's id when the body does not.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The header that names the request an answer is to.
const REQUEST_ID: &str = "wasmproc-request-id";

/// Sends a workflow a request, a message it answers, and waits for the answer.
///
/// The request is recorded before it is delivered and the answer before it is given, so
/// asking again with the same id never delivers it twice and gets the answer given, after
/// a restart of the server too.
#[utoipa::path(post, path = "/v1/workflows/{id}/request", tag = "workflows", security(("bearer" = [])),
    params(
        ("id" = String, Path, description = "The workflow's id"),
        ("Idempotency-Key" = Option<String>, Header, description = "The request's id, if the body has none"),
        RequestQuery,
    ),
    request_body = WorkflowRequest,
    responses(
        (status = 200, description = "The workflow's answer, as it gave it (any JSON); the header \
            `wasmproc-request-id` names the request", body = serde_json::Value),
        (status = 202, description = "No answer yet after the wait: ask again with the same id", body = RequestPending),
        (status = 400, description = "`invalid`: an unreadable path, malformed JSON, an empty topic, an invalid \
            id, ids in the body and the header that differ, or a `timeout` that is no duration", body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        (status = 409, description = "`conflict`: the id was used with another topic or body; `not_running`: \
            the workflow has ended", body = ErrorBody),
        (status = 410, description = "`unanswered`: the workflow ended without answering", body = ErrorBody),
        (status = 422, description = "`request_failed`: the workflow answered with an error", body = ErrorBody),
        (status = 429, description = "`mailbox_full`: its mailbox is full; `too_many_requests`: it has the most \
            unanswered requests it may have (`--max-pending-requests`)", body = ErrorBody),
        WithJson,
        AsTenant,
    ))]
async fn request(
    Asker { service, tenant }: Asker,
    Segment(id): Segment,
    asked: Result<Query<RequestQuery>, QueryRejection>,
    headers: HeaderMap,
    JsonBody(mut ask): JsonBody<WorkflowRequest>,
) -> Answer {
    if let Some(key) = headers.get(IDEMPOTENCY_KEY) {
        let key = key.to_str().map_err(|_| Refusal::invalid("the `Idempotency-Key` header is not text"))?;
        match &ask.id {
            Some(given) if given != key => {
                return Err(Refusal::invalid(format!(
                    "the request's `id` `{given}` and its `Idempotency-Key` `{key}` differ; give one"
                )));
            }
            _ => ask.id = Some(key.to_owned()),
        }
    }
    let timeout = match query(asked)?.timeout {
        Some(text) => humantime::parse_duration(&text)
            .map_err(|e| Refusal::invalid(format!("invalid `timeout` `{text}` ({e}): a duration such as `30s`")))?,
        None => Duration::from_secs(30),
    };
    let submitted = blocking({
        let (service, tenant, id) = (service.clone(), tenant.clone(), id.clone());
        move || service.submit_request(&tenant, &id, ask)
    })
    .await?;
    let request_id = submitted.id.clone();
    let named = [(REQUEST_ID, request_id.clone())];
    match service.await_answer(submitted, timeout).await? {
        Answered::Ok(value) => Ok((StatusCode::OK, named, Json(value)).into_response()),
        Answered::Error(error) => Err(Refusal::new(
            422,
            "request_failed",
            format!("workflow `{id}` answered request `{request_id}` with an error: {error}"),
        )),
        Answered::Pending => {
            let pending = RequestPending { request: PendingRequest { id: request_id, state: "pending".to_owned() } };
            Ok((StatusCode::ACCEPTED, named, Json(pending)).into_response())
        }
    }
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct LogsQuery {
    /// After the lines kept, stream new ones as they are written, until the workflow
    /// ends; `false` when absent.
    follow: Option<bool>,
}

/// A workflow's log: the lines each of its processes logged or printed, oldest first.
///
/// Newline-delimited JSON (`application/x-ndjson`), one object a line: `{"seq", "ms",
/// "pid", "source", "message"}` for a line (`source`: a level, `stdout` or `stderr`);
/// `{"dropped", "message"}` first when older lines were dropped (a workflow keeps at most
/// the server's `--max-log-bytes`); `{"missed", "message"}` when a follower read more
/// slowly than the workflow logged and lines were not sent to it; `{"lost", "message"}`
/// when the server's log writer fell behind.
#[utoipa::path(get, path = "/v1/workflows/{id}/logs", tag = "workflows", security(("bearer" = [])),
    params(("id" = String, Path, description = "The workflow's id"), LogsQuery),
    responses(
        (status = 200, description = "Its log, newline-delimited JSON", content_type = "application/x-ndjson",
            body = String),
        (status = 400, description = "`invalid`: an unreadable path, or a `follow` that is no boolean",
            body = ErrorBody),
        (status = 404, description = "`not_found`: the tenant has no such workflow", body = ErrorBody),
        AsTenant,
    ))]
async fn logs(
    Asker { service, tenant }: Asker,
    Segment(id): Segment,
    asked: Result<Query<LogsQuery>, QueryRejection>,
) -> Answer {
    let follow = query(asked)?.follow.unwrap_or(false);
    let body = service.log_body(&tenant, &id, follow).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}
