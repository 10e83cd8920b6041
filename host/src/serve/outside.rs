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

/// Answers `request` with a denial saying `why`.
fn deny(request: Request<'_>, why: String) {
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
        match profile.as_ref().and_then(|p| p.http.as_ref()) {
            Some(Ok(http)) => http.handle(request),
            Some(Err(why)) => {
                let why = format!("`{}` cannot be served: {why}", request.name());
                deny(request, why);
            }
            None => {
                let why = format!(
                    "`{}` needs an allowed host: start the workflow with `--allow-host PATTERN` (`grants.hosts`), \
                     within its tenant's policy",
                    request.name()
                );
                deny(request, why);
            }
        }
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
        match profile.as_ref().and_then(|p| p.files.as_ref()) {
            Some(Ok(files)) => files.handle(request),
            Some(Err(why)) => {
                let why = format!("`{}` cannot be served: {why}", request.name());
                deny(request, why);
            }
            None => {
                let why = format!(
                    "`{}` needs a directory: start the workflow with `--dir HOST[::GUEST]` (`grants.dirs`), within \
                     its tenant's policy",
                    request.name()
                );
                deny(request, why);
            }
        }
    }

    fn reads_only(&self, name: &str) -> bool {
        matches!(name, "fs.read" | "fs.list" | "fs.stat")
    }
}
