//! The tenants' components: their bytes under `DATA/components/<hex>.wasm` (one copy
//! whoever uploaded them), compiled once and kept loaded, and the kinds they are to the
//! scheduler: `TENANT/sha256:<hex>@ID` for the processes of workflow `ID`, so that the
//! journal records whose a process is and which workflow's limits it runs under, and a
//! spawn resolves names in its spawner's tenant and workflow only.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};

use super::policy::{Profiles, Quotas};
use super::registry::{ComponentRecord, Registry};
use crate::handler::{Factory, KindLimits, KindSource};
use crate::process::Process;
use crate::scheduler::ProcessQuota;
use crate::wasm::{Component, Declared, Runtime};

/// The components and where they live.
pub(super) struct Code {
    dir: PathBuf,
    runtime: Runtime,
    registry: Arc<Registry>,
    /// Loaded components by hash: each is compiled once per server.
    loaded: Mutex<HashMap<String, Component>>,
}

/// The hex of `bytes`' SHA-256.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    crate::codec::hex(&Sha256::digest(bytes))
}

/// Whether `name` may name a component: letters, digits, `-`, `_` and `.`, 1 to 64
/// characters, not starting with `sha256:` (hashes name themselves).
pub(super) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Code {
    /// The runtime its components run in.
    pub(super) fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub(super) fn new(dir: PathBuf, runtime: Runtime, registry: Arc<Registry>) -> Code {
        Code { dir, runtime, registry, loaded: Mutex::new(HashMap::new()) }
    }

    fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{}.wasm", hash.trim_start_matches("sha256:")))
    }

    /// Validates and compiles `bytes`, keeps them, and records them as `tenant`'s.
    ///
    /// # Errors
    ///
    /// Bytes that are not a component of the `process` world (the load's own error), or
    /// a failure to write them.
    pub(super) fn add(&self, tenant: &str, bytes: &[u8], now_ms: u64) -> anyhow::Result<(ComponentRecord, bool)> {
        let hash = format!("sha256:{}", sha256_hex(bytes));
        if let Some(record) = self.registry.component(tenant, &hash)? {
            return Ok((record, false));
        }
        let component = match self.loaded.lock().get(&hash) {
            Some(component) => component.clone(),
            None => self.runtime.load_bytes(bytes)?,
        };
        let path = self.path(&hash);
        if !path.exists() {
            // Written whole under another name, then renamed: a crash leaves no torn file
            // under the name a load reads.
            let partial = path.with_extension("partial");
            let mut file = std::fs::OpenOptions::new();
            file.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut file, 0o600);
            let mut file = file.open(&partial)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&partial, &path)?;
        }
        let record = ComponentRecord {
            hash: hash.clone(),
            size: bytes.len() as u64,
            entries: component.entries().to_vec(),
            commands: match Declared::read(bytes) {
                Declared::Commands { commands, .. } => Some(commands),
                Declared::Undeclared | Declared::Unreadable(_) => None,
            },
            uploaded_ms: now_ms,
        };
        self.registry.put_component(tenant, &record)?;
        self.loaded.lock().insert(hash, component);
        Ok((record, true))
    }

    /// Removes the bytes of `hash`, which no tenant has any more, and unloads it.
    ///
    /// # Errors
    ///
    /// The file cannot be removed.
    pub(super) fn remove(&self, hash: &str) -> anyhow::Result<()> {
        self.loaded.lock().remove(hash);
        let path = self.path(hash);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(anyhow::anyhow!("cannot remove `{}`: {error}", path.display())),
        }
    }

    /// The component of `hash`, loaded once.
    pub(super) fn component(&self, hash: &str) -> anyhow::Result<Component> {
        if let Some(component) = self.loaded.lock().get(hash) {
            return Ok(component.clone());
        }
        let bytes = std::fs::read(self.path(hash))
            .map_err(|e| anyhow::anyhow!("component `{hash}` is missing from the data directory: {e}"))?;
        let component = self.runtime.load_bytes(&bytes)?;
        self.loaded.lock().insert(hash.to_owned(), component.clone());
        Ok(component)
    }

    /// The hash `reference` names for `tenant`: `sha256:<hex>` of one of its components,
    /// or a name (`NAME`, `NAME:TAG`) it gave one.
    pub(super) fn find(&self, tenant: &str, reference: &str) -> anyhow::Result<Option<String>> {
        if reference.starts_with("sha256:") {
            return Ok(self.registry.has_component(tenant, reference)?.then(|| reference.to_owned()));
        }
        self.registry.name(tenant, reference)
    }
}

/// The scheduler's view of the components: see the module's docs.
pub(super) struct Kinds {
    pub(super) code: Arc<Code>,
    pub(super) profiles: Arc<Profiles>,
    pub(super) quotas: Arc<Quotas>,
}

/// `TENANT/REST` as the tenant, the reference and the workflow (`REST` = `REF@ID`).
pub(super) fn parts(kind: &str) -> Option<(&str, &str, Option<&str>)> {
    let (tenant, rest) = kind.split_once('/')?;
    Some(match rest.split_once('@') {
        Some((reference, workflow)) => (tenant, reference, Some(workflow)),
        None => (tenant, rest, None),
    })
}

impl KindSource for Kinds {
    fn resolve(&self, name: &str, spawner: Option<&str>) -> Option<(Arc<str>, Arc<dyn Factory>)> {
        let spawner = spawner.map(|kind| parts(kind).map(|(tenant, _, workflow)| (tenant, workflow)));
        let (tenant, reference, workflow) = match (parts(name), spawner) {
            // A recorded name: only within its own tenant, and a process spawns within its
            // own workflow (another's would lend it that workflow's limits).
            (Some((tenant, reference, workflow)), spawner) => {
                if let Some(spawner) = spawner
                    && spawner != Some((tenant, workflow))
                {
                    return None;
                }
                (tenant, reference, workflow)
            }
            // A name the spawner's tenant gave a component: in the spawner's workflow.
            (None, Some(Some((tenant, workflow)))) => (tenant, name, workflow),
            (None, _) => return None,
        };
        let hash = self.code.find(tenant, reference).ok()??;
        let component = match self.code.component(&hash) {
            Ok(component) => component,
            Err(error) => {
                tracing::error!("cannot load component `{hash}` of tenant `{tenant}`: {error:#}");
                return None;
            }
        };
        let Some(workflow) = workflow else {
            return Some((format!("{tenant}/{hash}").into(), Arc::new(component)));
        };
        let recorded: Arc<str> = format!("{tenant}/{hash}@{workflow}").into();
        match self.profiles.get(tenant, workflow) {
            Some(profile) => {
                let own = component.limits()?;
                let quota = self.quotas.get(tenant);
                Some((recorded, Arc::new(Bounded { limits: profile.bound(own), component, quota })))
            }
            // A workflow forgotten while a process of it was being remade: its own limits.
            None => Some((recorded, Arc::new(component))),
        }
    }
}

/// A component whose processes run under a workflow's limits, and count against its
/// tenant's quota when resumed as its root.
struct Bounded {
    component: Component,
    limits: KindLimits,
    quota: Option<ProcessQuota>,
}

impl Factory for Bounded {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        self.component.make_within(self.limits)
    }

    fn identity(&self) -> Option<String> {
        self.component.identity()
    }

    fn limits(&self) -> Option<KindLimits> {
        Some(self.limits)
    }

    fn quota(&self) -> Option<ProcessQuota> {
        self.quota.clone()
    }

    fn make_within(&self, bound: KindLimits) -> anyhow::Result<Box<dyn Process>> {
        self.component.make_within(self.limits.min(bound))
    }
}
