//! The console: its page and assets under `/ui` (built into the binary, taking no
//! token: they hold no data), and the routes it reads beside the workflows' own, the
//! counts by state and the host's figures (a tenant's token, as every route of a
//! tenant's).
//!
//! The page keeps the token the user gives it in the tab's `sessionStorage` and sends it
//! as a bearer token to `/v1`; never in a URL. Its `Content-Security-Policy` lets it load
//! and fetch from this host only and run no inline script, so text a workflow wrote (its
//! id, its logs, its result) cannot run as code in it.

use std::sync::OnceLock;

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::super::overview::CountFilter;
use super::super::wire::{ErrorBody, HostFigures, WorkflowCounts};
use super::{Answer, AsTenant, Asker, Segment, answer, blocking, query};
use crate::serve::Refusal;

/// The console's files: name, media type, bytes.
const ASSETS: [(&str, &str, &str); 3] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../ui/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../ui/app.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("../ui/app.css")),
];

/// What the page may load and run: this host's own files and API, nothing inline, no
/// frame around it.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

/// The entity tag of every asset: they change only with the binary, so one tag of all
/// their bytes (FNV-1a) serves them all.
fn etag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for (_, _, text) in ASSETS {
            for byte in text.bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("\"{hash:016x}\"")
    })
}

fn asset(name: &str, headers: &HeaderMap) -> Result<Response, Refusal> {
    let (_, kind, text) = ASSETS
        .iter()
        .find(|(asset, _, _)| *asset == name)
        .ok_or_else(|| Refusal::not_found(format_args!("console file `{name}`: the console is at `/ui`")))?;
    let tag = etag();
    let fresh = headers.get(header::IF_NONE_MATCH).is_some_and(|given| given.as_bytes() == tag.as_bytes());
    let mut response = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { (*text).into_response() };
    let set = response.headers_mut();
    set.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    set.insert(header::ETAG, HeaderValue::from_static(tag));
    set.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    set.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    set.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    set.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    Ok(response)
}

/// The console: a page to see and control the tenant's workflows and the host.
///
/// It asks for a tenant's token and reads everything through this API with it.
#[utoipa::path(get, path = "/ui", tag = "console",
    responses(
        (status = 200, description = "The console's page", body = String, content_type = "text/html"),
        (status = 304, description = "Not modified since the `ETag` given in `If-None-Match`"),
    ))]
pub(super) async fn page(headers: HeaderMap) -> Answer {
    asset("index.html", &headers)
}

/// One of the console's files (`app.js`, `app.css`).
#[utoipa::path(get, path = "/ui/{file}", tag = "console",
    params(("file" = String, Path, description = "The file's name")),
    responses(
        (status = 200, description = "The file", body = String, content_type = "text/plain"),
        (status = 304, description = "Not modified since the `ETag` given in `If-None-Match`"),
        (status = 400, description = "`invalid`: an unreadable path", body = ErrorBody),
        (status = 404, description = "`not_found`: the console has no such file", body = ErrorBody),
    ))]
pub(super) async fn file(Segment(name): Segment, headers: HeaderMap) -> Answer {
    asset(&name, &headers)
}

/// The tenant's workflows counted by state.
///
/// Reads every workflow the filter selects (as a listing reads them), so it costs about
/// as much as a page of a listing that filters most of them out.
#[utoipa::path(get, path = "/v1/workflow-counts", tag = "workflows", security(("bearer" = [])),
    params(CountFilter),
    responses(
        (status = 200, description = "The counts", body = WorkflowCounts),
        (status = 400, description = "`invalid`: an unreadable query", body = ErrorBody),
        AsTenant,
    ))]
pub(super) async fn counts(
    Asker { service, tenant }: Asker,
    filter: Result<Query<CountFilter>, QueryRejection>,
) -> Answer {
    let filter = query(filter)?;
    let counts = blocking(move || service.counts(&tenant, &filter)).await?;
    answer(StatusCode::OK, counts)
}

/// The host's figures now: its workers, steps, processes, messages and journal, as
/// `/metrics` reads them, with the tenant's own running workflows.
///
/// Counters count from the server's start; a rate is two readings' difference over
/// their `at_ms`. They say how loaded the host is, never whose work it is.
#[utoipa::path(get, path = "/v1/host", tag = "operations", security(("bearer" = [])),
    responses((status = 200, description = "The figures", body = HostFigures), AsTenant))]
pub(super) async fn host(Asker { service, tenant }: Asker) -> Answer {
    answer(StatusCode::OK, service.host_figures(&tenant))
}
