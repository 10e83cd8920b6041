//! Tenants' policies, and what one workflow asks for within its tenant's.
//!
//! A [`Policy`] bounds what a tenant's workflows may be granted (commands over other
//! processes, the tenant's key-value store) and sets its quotas (running workflows,
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
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use super::Refusal;
use crate::caps::Capabilities;
use crate::limits::KindLimits;

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
    /// The most workflows it may have running at once.
    pub max_running: usize,
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
    /// key-value store, 10,000 running workflows, `memory` bytes a process, 1 GiB of
    /// storage and 1,000 requests a second.
    pub fn new(memory: u64) -> Policy {
        Policy { allow: Vec::new(), kv: false, max_running: 10_000, memory, storage: 1 << 30, rate: 1_000 }
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
        Ok(())
    }
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
    /// See [`Policy::max_running`].
    #[serde(default)]
    pub max_running: Option<usize>,
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
        let mut allow = self.allow.unwrap_or_else(|| base.allow.clone());
        allow.sort();
        allow.dedup();
        Policy {
            allow,
            kv: self.kv.unwrap_or(base.kv),
            max_running: self.max_running.unwrap_or(base.max_running),
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
        for names in [&mut self.allow, &mut self.deny] {
            names.sort();
            names.dedup();
        }
        self
    }
}

/// What a workflow was started with, resolved: its grants and its processes' limits.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Profile {
    pub(super) caps: Capabilities,
    /// The store of this tenant, if granted.
    pub(super) kv: bool,
    pub(super) memory: u64,
    pub(super) cpu_budget: Option<Duration>,
}

impl Profile {
    /// What a workflow recorded with `grants` and `limits` runs with: the defaults, what
    /// it was granted, and its limits (`policy`'s memory for a workflow recorded without
    /// one, started before policies).
    pub(super) fn recorded(policy: &Policy, grants: &Grants, limits: &Limits) -> Profile {
        let mut caps = ALWAYS.into_iter().fold(Capabilities::over_self(), Capabilities::allow);
        for name in &grants.allow {
            caps = caps.allow(name);
        }
        if grants.kv {
            caps = caps.allow("kv.*");
        }
        for name in &grants.deny {
            caps = caps.deny(name);
        }
        Profile {
            caps,
            kv: grants.kv,
            memory: limits.memory.unwrap_or(policy.memory),
            cpu_budget: limits.cpu_budget_ms.map(Duration::from_millis),
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
    Ok((Profile::recorded(policy, grants, &limits), limits))
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
        let refused = resolve("acme", &policy, &asked, &Limits::default()).unwrap_err();
        assert_eq!((refused.status, refused.code), (403, "beyond_policy"));
        assert!(refused.message.contains("wasmproc tenant policy acme --allow terminate"), "{}", refused.message);

        policy.allow = vec!["terminate".into()];
        policy.kv = true;
        let asked = Grants { kv: true, deny: vec!["spawn".into()], ..asked };
        let (profile, limits) = resolve("acme", &policy, &asked, &Limits::default()).unwrap();
        assert!(profile.caps.allows("terminate") && profile.caps.allows("kv.put") && profile.caps.allows("time.now"));
        assert!(!profile.caps.allows("spawn") && !profile.caps.allows("link") && !profile.caps.allows("http.request"));
        assert_eq!(limits.memory, Some(32 << 20), "the policy's memory when none is asked");

        let more = Limits { memory: Some(64 << 20), cpu_budget_ms: None };
        let refused = resolve("acme", &policy, &Grants::default(), &more).unwrap_err();
        assert!(refused.message.contains("--memory 67108864"), "{}", refused.message);
        let unknown = Grants { allow: vec!["kv.get".into()], ..Grants::default() };
        assert_eq!(resolve("acme", &policy, &unknown, &Limits::default()).unwrap_err().status, 400);
    }
}
