//! The families `http` and `fs` over each workflow's own grants: a process's command goes
//! to the provider its workflow was granted ([`Profile::http`], [`Profile::files`]),
//! found through its kind (`TENANT/…@ID`, which the service gives every process of a
//! workflow), so a guest cannot borrow another workflow's hosts or directories.

use std::sync::Arc;

use super::code::parts;
use super::policy::{Profile, Profiles};
use crate::handler::Request;
use crate::provider::{ErrorCode, Failure, Provider};

/// The profile of the workflow `request`'s process belongs to.
fn profile_of(profiles: &Profiles, request: &Request<'_>) -> Option<Arc<Profile>> {
    let (tenant, _, workflow) = parts(request.kind()?)?;
    profiles.get(tenant, workflow?)
}

/// Hands `request` to the provider its workflow was granted (`granted`: `None` if none
/// was, an error if the grant cannot be served), or denies it saying why; `needs` is
/// what the request needs and how a start grants it.
fn route<P: Provider>(request: Request<'_>, granted: Option<&Result<P, String>>, needs: &str) {
    let why = match granted {
        Some(Ok(provider)) => return provider.handle(request),
        Some(Err(why)) => format!("`{}` cannot be served: {why}", request.name()),
        None => format!("`{}` needs {needs}, within its tenant's policy", request.name()),
    };
    request.complete(Err(Failure::new(ErrorCode::Denied, why).into()));
}

/// The family `http` over the workflows' hosts.
pub(super) struct WorkflowHttp(pub(super) Arc<Profiles>);

impl Provider for WorkflowHttp {
    fn family(&self) -> &str {
        "http"
    }

    fn handle(&self, request: Request<'_>) {
        let profile = profile_of(&self.0, &request);
        let needs = "an allowed host: start the workflow with `--allow-host PATTERN` (`grants.hosts`)";
        route(request, profile.as_ref().and_then(|p| p.http.as_ref()), needs);
    }
}

/// The family `fs` over the workflows' directories.
pub(super) struct WorkflowFiles(pub(super) Arc<Profiles>);

impl Provider for WorkflowFiles {
    fn family(&self) -> &str {
        "fs"
    }

    fn handle(&self, request: Request<'_>) {
        let profile = profile_of(&self.0, &request);
        let needs = "a directory: start the workflow with `--dir HOST[::GUEST]` (`grants.dirs`)";
        route(request, profile.as_ref().and_then(|p| p.files.as_ref()), needs);
    }

    fn reads_only(&self, name: &str) -> bool {
        matches!(name, "fs.read" | "fs.list" | "fs.stat")
    }
}
