//! Tenants' policies, and what one workflow asks for within its tenant's.
//!
//! A [`Policy`] bounds what a tenant's workflows may be granted (commands over other
//! processes, the tenant's key-value store, HTTP hosts, host directories) and sets its
//! quotas (running workflows,
//! memory per process, storage, request rate). A workflow's [`Grants`] and [`Limits`]
//! come with its start request; anything beyond its tenant's policy is refused with
//! `403 beyond_policy`, naming what was asked, what the policy allows, and the admin's
//! command that would allow it. A policy that changes bounds the workflows started after
//! the change: a running workflow keeps what it was started with (its journal holds its
//! grants, its kind its limits), also across restarts.
//!
//! What a workflow was started with is its [`Profile`], kept in memory for the kinds and
//! the providers ([`Profiles`]), which find it through the workflow's kind: the root
//! process of workflow `ID` of tenant `T` is of kind `T/sha256:HEX@ID`, and every process
//! it spawns, of whichever of the tenant's components, carries the same `@ID` (see
//! `code.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use super::Refusal;
use crate::caps::Capabilities;
use crate::limits::KindLimits;
use crate::provider::fs::{Files, Grant};
use crate::provider::http::{HostPattern, Http};

/// What every workflow is granted whatever it asks: the host's clock and random numbers
/// (as `run` grants them), and answering the requests it is sent.
pub(super) const ALWAYS: [&str; 3] = ["time.*", "random.*", super::requests::ANSWER];

/// What a tenant's workflows may be granted at most, and its quotas.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The built-in commands over other processes its workflows may be granted (of
    /// `terminate`, `exit` and `link`; without them a workflow may still end, signal and
    /// link its own children).
    pub allow: Vec<String>,
    /// Whether its workflows may be granted its key-value store (`kv.*`).
    pub kv: bool,
    /// The HTTP hosts its workflows may be granted (`http.request`): patterns as `run
    /// --allow-host` takes them; a workflow's pattern must lie within one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// The host directories (absolute) its workflows may be granted to read (`fs.read`,
    /// `fs.list`, `fs.stat`), each with everything beneath it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<String>,
    /// The host directories (absolute) its workflows may be granted to read and write
    /// (`fs.*`), each with everything beneath it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs_rw: Vec<String>,
    /// The most workflows it may have running at once.
    pub max_running: usize,
    /// The most processes its workflows may have alive at once, their children (to any
    /// depth) included; past it a start is refused (429) and a spawn fails.
    #[serde(default = "default_max_processes")]
    pub max_processes: usize,
    /// The most linear memory of each process of its workflows, in bytes: a workflow's
    /// own when it asks for none.
    pub memory: u64,
    /// The most bytes its components and its key-value data may take together.
    pub storage: u64,
    /// The requests a second it may make, on average; bursts of up to a second's worth
    /// pass at once.
    pub rate: u32,
}

impl Policy {
    /// The service's default for new tenants: no command over other processes, no
    /// key-value store, no HTTP host, no directory, 10,000 running workflows, `memory`
    /// bytes a process, 1 GiB of storage and 1,000 requests a second.
    pub fn new(memory: u64) -> Policy {
        Policy {
            allow: Vec::new(),
            kv: false,
            hosts: Vec::new(),
            dirs: Vec::new(),
            dirs_rw: Vec::new(),
            max_running: 10_000,
            max_processes: default_max_processes(),
            memory,
            storage: 1 << 30,
            rate: 1_000,
        }
    }

    /// Refuses a policy the server cannot hold: a command that is not one over other
    /// processes, memory past what a process may have here (`max_memory`, the server's
    /// `--memory`) or below one Wasm page, a rate of 0.
    pub(super) fn check(&self, max_memory: u64) -> Result<(), Refusal> {
        for name in &self.allow {
            if !Capabilities::OVER_OTHERS.contains(&name.as_str()) {
                return Err(Refusal::invalid(format!(
                    "a policy's `allow` lists commands over other processes ({}), not `{name}`: the others are \
                     every workflow's",
                    Capabilities::OVER_OTHERS.join(", ")
                )));
            }
        }
        if self.memory > max_memory {
            return Err(Refusal::invalid(format!(
                "a policy's `memory` of {} bytes is more than a process may have on this server ({max_memory} \
                 bytes, its `--memory`)",
                self.memory
            )));
        }
        if self.memory < PAGE {
            return Err(Refusal::invalid(format!(
                "a policy's `memory` of {} bytes is less than one Wasm page ({PAGE} bytes)",
                self.memory
            )));
        }
        if self.rate == 0 {
            return Err(Refusal::invalid("a policy's `rate` must be at least 1 request a second"));
        }
        if self.max_processes == 0 {
            return Err(Refusal::invalid("a policy's `max_processes` must be at least 1"));
        }
        for pattern in &self.hosts {
            HostPattern::parse(pattern).map_err(|e| Refusal::invalid(format!("a policy's `hosts`: {e}")))?;
        }
        for (field, dirs) in [("dirs", &self.dirs), ("dirs_rw", &self.dirs_rw)] {
            for dir in dirs {
                if !Path::new(dir).is_absolute() {
                    return Err(Refusal::invalid(format!(
                        "a policy's `{field}` names host directories by absolute path, not `{dir}`"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A tenant's `max_processes` when its policy does not say (one kept from before the
/// field): 100,000, a tenth of the scheduler's default `max_processes`.
fn default_max_processes() -> usize {
    100_000
}

/// One Wasm page: the least memory a process may be given.
const PAGE: u64 = 64 << 10;

/// A policy as a request gives it: each field given replaces the base's (the server's
/// default for a new tenant or a `PUT`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyFields {
    /// See [`Policy::allow`].
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// See [`Policy::kv`].
    #[serde(default)]
    pub kv: Option<bool>,
    /// See [`Policy::hosts`].
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    /// See [`Policy::dirs`].
    #[serde(default)]
    pub dirs: Option<Vec<String>>,
    /// See [`Policy::dirs_rw`].
    #[serde(default)]
    pub dirs_rw: Option<Vec<String>>,
    /// See [`Policy::max_running`].
    #[serde(default)]
    pub max_running: Option<usize>,
    /// See [`Policy::max_processes`].
    #[serde(default)]
    pub max_processes: Option<usize>,
    /// See [`Policy::memory`].
    #[serde(default)]
    pub memory: Option<u64>,
    /// See [`Policy::storage`].
    #[serde(default)]
    pub storage: Option<u64>,
    /// See [`Policy::rate`].
    #[serde(default)]
    pub rate: Option<u32>,
}

impl PolicyFields {
    /// `base` with the fields given here.
    pub fn over(self, base: &Policy) -> Policy {
        let sorted = |given: Option<Vec<String>>, base: &Vec<String>| {
            let mut names = given.unwrap_or_else(|| base.clone());
            names.sort();
            names.dedup();
            names
        };
        Policy {
            allow: sorted(self.allow, &base.allow),
            kv: self.kv.unwrap_or(base.kv),
            hosts: sorted(self.hosts, &base.hosts),
            dirs: sorted(self.dirs, &base.dirs),
            dirs_rw: sorted(self.dirs_rw, &base.dirs_rw),
            max_running: self.max_running.unwrap_or(base.max_running),
            max_processes: self.max_processes.unwrap_or(base.max_processes),
            memory: self.memory.unwrap_or(base.memory),
            storage: self.storage.unwrap_or(base.storage),
            rate: self.rate.unwrap_or(base.rate),
        }
    }
}

/// What a workflow asks to be granted beyond every workflow's defaults (the built-in
/// commands but those over other processes, and the clock and random numbers).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Grants {
    /// Built-in commands over other processes (`terminate`, `exit`, `link`), each within
    /// the policy's `allow`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Built-in commands withdrawn from the defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// The tenant's key-value store (`kv.*`), if its policy allows it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kv: bool,
    /// HTTP hosts its processes may reach (`http.request`), as `run --allow-host` takes
    /// them, each within the policy's `hosts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Host directories its processes may read (`fs.read`, `fs.list`, `fs.stat`), as
    /// `run --dir` takes them: `HOST[::GUEST]`, HOST absolute and within the policy's
    /// `dirs` or `dirs_rw`, GUEST where the processes see it (HOST when absent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<String>,
    /// Host directories its processes may read and write (`fs.*`), as `run --dir-rw`
    /// takes them, each within the policy's `dirs_rw`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs_rw: Vec<String>,
}

/// What a workflow's processes run under, each at most its tenant's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Each process's linear memory cap, in bytes; the policy's `memory` when absent.
    #[serde(default)]
    pub memory: Option<u64>,
    /// Each process's whole-life CPU time, in milliseconds; a process past it fails.
    /// None when absent.
    #[serde(default)]
    pub cpu_budget_ms: Option<u64>,
}

impl Grants {
    /// Sorted and without repeats, so that two requests asking the same compare equal.
    pub(super) fn normalised(mut self) -> Grants {
        for names in [&mut self.allow, &mut self.deny, &mut self.hosts, &mut self.dirs, &mut self.dirs_rw] {
            names.sort();
            names.dedup();
        }
        self
    }
}

/// What a workflow was started with, resolved: its grants and its processes' limits.
#[derive(Debug, Clone)]
pub(super) struct Profile {
    pub(super) caps: Capabilities,
    /// The store of this tenant, if granted.
    pub(super) kv: bool,
    pub(super) memory: u64,
    pub(super) cpu_budget: Option<Duration>,
    /// The HTTP provider of its hosts, if granted any; why not, if it cannot be had.
    pub(super) http: Option<Result<Http, String>>,
    /// The file provider of its directories, if granted any; why not, if one cannot be
    /// opened (gone since it was granted).
    pub(super) files: Option<Result<Files, String>>,
}

/// The service's providers of the outside world, started on first use; each workflow's
/// are cut from them ([`Http::within`], [`Files::within`]), so one HTTP thread and one
/// set of file threads serve every workflow.
#[derive(Default)]
pub(super) struct Outside {
    http: std::sync::OnceLock<Result<Http, String>>,
    files: std::sync::OnceLock<Result<Files, String>>,
}

impl Outside {
    fn http(&self, patterns: &[String]) -> Result<Http, String> {
        let base = self.http.get_or_init(|| {
            Http::start(crate::provider::http::HttpSettings::default())
                .map_err(|e| format!("the server cannot make HTTP requests: {e:#}"))
        });
        let allow = patterns.iter().map(|p| HostPattern::parse(p)).collect::<Result<Vec<_>, _>>()?;
        Ok(base.as_ref().map_err(Clone::clone)?.within(allow))
    }

    fn files(&self, grants: Vec<Grant>) -> Result<Files, String> {
        let base = self.files.get_or_init(|| {
            Files::new(Vec::new(), crate::provider::fs::FilesSettings::default())
                .map_err(|e| format!("the server cannot serve files: {e:#}"))
        });
        base.as_ref().map_err(Clone::clone)?.within(grants).map_err(|e| format!("{e:#}"))
    }
}

/// A directory grant as `run --dir` spells it (`HOST[::GUEST]`): the host directory and
/// the guest path.
fn dir_spec(spec: &str) -> (&str, &str) {
    spec.split_once("::").unwrap_or((spec, spec))
}

/// The directories `grants` grants, for [`Files::within`].
fn dir_grants(grants: &Grants) -> Vec<Grant> {
    let specs = grants.dirs.iter().map(|spec| (spec, false)).chain(grants.dirs_rw.iter().map(|spec| (spec, true)));
    specs
        .map(|(spec, writable)| {
            let (host, guest) = dir_spec(spec);
            Grant { host: PathBuf::from(host), guest: guest.to_owned(), writable }
        })
        .collect()
}

impl Profile {
    /// What a workflow recorded with `grants` and `limits` runs with: the defaults, what
    /// it was granted, and its limits (`policy`'s memory for a workflow recorded without
    /// one, started before policies).
    pub(super) fn recorded(policy: &Policy, grants: &Grants, limits: &Limits, outside: &Outside) -> Profile {
        // Shared by every workflow's grants until one is changed (its custom names are
        // behind an `Arc`): most workflows are granted nothing beyond it.
        static BASE: std::sync::LazyLock<Capabilities> =
            std::sync::LazyLock::new(|| ALWAYS.into_iter().fold(Capabilities::over_self(), Capabilities::allow));
        let mut caps = BASE.clone();
        for name in &grants.allow {
            caps = caps.allow(name);
        }
        if grants.kv {
            caps = caps.allow("kv.*");
        }
        let http = (!grants.hosts.is_empty()).then(|| outside.http(&grants.hosts));
        if http.is_some() {
            caps = caps.allow("http.*");
        }
        // Each directory's grant says whether it may be written: the provider refuses a
        // change to a directory granted to read.
        let files = (!grants.dirs.is_empty() || !grants.dirs_rw.is_empty()).then(|| outside.files(dir_grants(grants)));
        if files.is_some() {
            caps = caps.allow("fs.*");
        }
        for name in &grants.deny {
            caps = caps.deny(name);
        }
        Profile {
            caps,
            kv: grants.kv,
            memory: limits.memory.unwrap_or(policy.memory),
            cpu_budget: limits.cpu_budget_ms.map(Duration::from_millis),
            http,
            files,
        }
    }

    /// The limits the workflow's processes run under, tightening `own` (a component's).
    pub(super) fn bound(&self, own: KindLimits) -> KindLimits {
        let mut bound = KindLimits::new(self.memory as usize, own.time_slice);
        if let Some(budget) = self.cpu_budget {
            bound = bound.cpu_budget(budget);
        }
        own.min(bound)
    }
}

/// The refusal of something beyond `tenant`'s policy: what was asked, and the admin's
/// command that would allow it.
fn beyond(tenant: &str, asked: &str, allows: &str, fix: &str) -> Refusal {
    Refusal::new(
        403,
        "beyond_policy",
        format!(
            "the workflow asks for {asked}, beyond tenant `{tenant}`'s policy ({allows}): ask for less, or have the \
             admin run `wasmproc tenant policy {tenant} {fix}`"
        ),
    )
}

/// Resolves what a workflow of `tenant` asks for within `policy`: its profile, with its
/// limits as recorded (the policy's memory filled in when it asks for none).
///
/// # Errors
///
/// A name that is not a built-in command (400), or anything beyond the policy (403).
pub(super) fn resolve(
    tenant: &str,
    policy: &Policy,
    grants: &Grants,
    limits: &Limits,
    outside: &Outside,
) -> Result<(Profile, Limits), Refusal> {
    for (what, names) in [("allow", &grants.allow), ("deny", &grants.deny)] {
        for name in names {
            if !Capabilities::BUILTIN.contains(&name.as_str()) {
                return Err(Refusal::invalid(format!(
                    "`{what}` names built-in commands ({}), not `{name}`; the key-value store is `kv`",
                    Capabilities::BUILTIN.join(", ")
                )));
            }
        }
    }
    for name in &grants.allow {
        if Capabilities::OVER_OTHERS.contains(&name.as_str()) && !policy.allow.contains(name) {
            let allows = if policy.allow.is_empty() {
                "no command over other processes".to_owned()
            } else {
                format!("it allows {}", policy.allow.join(", "))
            };
            return Err(beyond(tenant, &format!("`{name}`"), &allows, &format!("--allow {name}")));
        }
    }
    if grants.kv && !policy.kv {
        return Err(beyond(tenant, "the key-value store", "no key-value store", "--kv"));
    }
    within_hosts(tenant, policy, &grants.hosts)?;
    within_dirs(tenant, policy, grants)?;
    let memory = limits.memory.unwrap_or(policy.memory);
    if memory > policy.memory {
        return Err(beyond(
            tenant,
            &format!("{memory} bytes of memory a process"),
            &format!("at most {} bytes", policy.memory),
            &format!("--memory {memory}"),
        ));
    }
    if memory < PAGE {
        return Err(Refusal::invalid(format!("`memory` of {memory} bytes is less than one Wasm page ({PAGE} bytes)")));
    }
    if limits.cpu_budget_ms == Some(0) {
        return Err(Refusal::invalid("`cpu_budget_ms` must be at least 1"));
    }
    let limits = Limits { memory: Some(memory), cpu_budget_ms: limits.cpu_budget_ms };
    let profile = Profile::recorded(policy, grants, &limits, outside);
    if let Some(Err(why)) = &profile.http {
        return Err(Refusal::internal(&anyhow::anyhow!("{why}")));
    }
    if let Some(Err(why)) = &profile.files {
        return Err(Refusal::invalid(format!("`dirs`: {why}")));
    }
    Ok((profile, limits))
}

/// Refuses a host pattern that does not parse (400) or lies within none of `policy`'s
/// (403).
fn within_hosts(tenant: &str, policy: &Policy, hosts: &[String]) -> Result<(), Refusal> {
    let allowed: Vec<HostPattern> = policy.hosts.iter().filter_map(|p| HostPattern::parse(p).ok()).collect();
    for asked in hosts {
        let pattern = HostPattern::parse(asked).map_err(|e| Refusal::invalid(format!("`hosts`: {e}")))?;
        if !allowed.iter().any(|wider| pattern.within(wider)) {
            let allows = if policy.hosts.is_empty() {
                "no HTTP host".to_owned()
            } else {
                format!("it allows hosts {}", policy.hosts.join(", "))
            };
            return Err(beyond(tenant, &format!("HTTP to `{asked}`"), &allows, &format!("--allow-host {asked}")));
        }
    }
    Ok(())
}

/// Refuses a directory grant that is not an absolute path to a directory of the server
/// (400), or that lies beneath none of `policy`'s of its kind (403). Paths are compared
/// resolved, so no link or `..` leads a grant out of the policy's directories.
fn within_dirs(tenant: &str, policy: &Policy, grants: &Grants) -> Result<(), Refusal> {
    let resolved =
        |dirs: &[String]| -> Vec<PathBuf> { dirs.iter().filter_map(|d| Path::new(d).canonicalize().ok()).collect() };
    let writable = resolved(&policy.dirs_rw);
    let readable: Vec<PathBuf> = resolved(&policy.dirs).into_iter().chain(writable.iter().cloned()).collect();
    for (field, specs, allowed, policy_dirs, flag) in [
        (
            "dirs",
            &grants.dirs,
            &readable,
            policy.dirs.iter().chain(&policy.dirs_rw).cloned().collect::<Vec<_>>(),
            "--dir",
        ),
        ("dirs_rw", &grants.dirs_rw, &writable, policy.dirs_rw.clone(), "--dir-rw"),
    ] {
        for spec in specs {
            let (host, guest) = dir_spec(spec);
            if !Path::new(host).is_absolute() || !guest.starts_with('/') {
                return Err(Refusal::invalid(format!(
                    "`{field}`: `{spec}` must be `HOST[::GUEST]` with both paths absolute (HOST on the server)"
                )));
            }
            let real = Path::new(host)
                .canonicalize()
                .ok()
                .filter(|path| path.is_dir())
                .ok_or_else(|| Refusal::invalid(format!("`{field}`: the server has no directory `{host}`")))?;
            if !allowed.iter().any(|dir| real.starts_with(dir)) {
                let allows = if policy_dirs.is_empty() {
                    format!("no directory for `{field}`")
                } else {
                    format!("it allows {} beneath {}", field, policy_dirs.join(", "))
                };
                return Err(beyond(tenant, &format!("the directory `{host}`"), &allows, &format!("{flag} {host}")));
            }
        }
    }
    Ok(())
}

/// Each tenant's process quota, as its policy sets it: shared by the service's starts
/// and the kinds, so that a workflow resumed from the journal counts where it did.
#[derive(Default)]
pub(super) struct Quotas {
    by_tenant: RwLock<HashMap<String, crate::scheduler::ProcessQuota>>,
}

impl Quotas {
    /// `tenant`'s quota, at `max`: its count so far, bounded by `max` from now on.
    pub(super) fn set(&self, tenant: &str, max: usize) -> crate::scheduler::ProcessQuota {
        let mut quotas = self.by_tenant.write();
        let quota = match quotas.get(tenant) {
            Some(quota) if quota.max() == max => return quota.clone(),
            Some(quota) => quota.with_max(max),
            None => crate::scheduler::ProcessQuota::new(format!("tenant `{tenant}`"), max),
        };
        quotas.insert(tenant.to_owned(), quota.clone());
        quota
    }

    pub(super) fn get(&self, tenant: &str) -> Option<crate::scheduler::ProcessQuota> {
        self.by_tenant.read().get(tenant).cloned()
    }
}

/// The profiles of the workflows that may have processes: by tenant and id.
#[derive(Default)]
pub(super) struct Profiles {
    by_workflow: RwLock<HashMap<(String, String), Arc<Profile>>>,
}

impl Profiles {
    pub(super) fn insert(&self, tenant: &str, id: &str, profile: Profile) {
        self.by_workflow.write().insert((tenant.to_owned(), id.to_owned()), Arc::new(profile));
    }

    pub(super) fn remove(&self, tenant: &str, id: &str) {
        self.by_workflow.write().remove(&(tenant.to_owned(), id.to_owned()));
    }

    pub(super) fn get(&self, tenant: &str, id: &str) -> Option<Arc<Profile>> {
        self.by_workflow.read().get(&(tenant.to_owned(), id.to_owned())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workflow_gets_what_it_asks_within_its_policy_and_is_refused_past_it() {
        let mut policy = Policy::new(32 << 20);
        let asked = Grants { allow: vec!["terminate".into()], ..Grants::default() };
        let refused = resolve("acme", &policy, &asked, &Limits::default(), &Outside::default()).unwrap_err();
        assert_eq!((refused.status, refused.code), (403, "beyond_policy"));
        assert!(refused.message.contains("wasmproc tenant policy acme --allow terminate"), "{}", refused.message);

        policy.allow = vec!["terminate".into()];
        policy.kv = true;
        let asked = Grants { kv: true, deny: vec!["spawn".into()], ..asked };
        let (profile, limits) = resolve("acme", &policy, &asked, &Limits::default(), &Outside::default()).unwrap();
        assert!(profile.caps.allows("terminate") && profile.caps.allows("kv.put") && profile.caps.allows("time.now"));
        assert!(!profile.caps.allows("spawn") && !profile.caps.allows("link") && !profile.caps.allows("http.request"));
        assert_eq!(limits.memory, Some(32 << 20), "the policy's memory when none is asked");

        let more = Limits { memory: Some(64 << 20), cpu_budget_ms: None };
        let refused = resolve("acme", &policy, &Grants::default(), &more, &Outside::default()).unwrap_err();
        assert!(refused.message.contains("--memory 67108864"), "{}", refused.message);
        let unknown = Grants { allow: vec!["kv.get".into()], ..Grants::default() };
        assert_eq!(
            resolve("acme", &policy, &unknown, &Limits::default(), &Outside::default()).unwrap_err().status,
            400
        );
    }
}
