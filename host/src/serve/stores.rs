//! Each tenant's key-value store, `DATA/kv/<tenant>`: one store for all of a tenant's
//! workflows, opened by the server, and reached by nobody else's.
//!
//! The service serves the family `kv` with [`TenantKv`]: a command goes to the store of
//! the tenant the yielding process's kind names (`TENANT/…`, which the service gives
//! every process of a tenant's workflows and which no guest chooses), so a process can
//! reach its own tenant's store and no other. A process needs `kv.*` granted as well,
//! which a workflow gets only when it asks and its tenant's policy allows it.
//!
//! A store is opened (a directory and a writer thread) for every tenant whose policy
//! allows one, and for every tenant with a running workflow granted one; it is bounded
//! by its tenant's `storage` quota together with the tenant's components
//! ([`SharedQuota`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::RwLock;

use crate::handler::{Provider, Request};
use crate::provider::kv::{Kv, KvSettings, SharedQuota};
use crate::provider::{ErrorCode, Failure};

/// The tenants' open stores.
pub(super) struct Stores {
    dir: PathBuf,
    open: RwLock<HashMap<String, (Kv, Arc<SharedQuota>)>>,
}

impl Stores {
    pub(super) fn new(dir: PathBuf) -> Stores {
        Stores { dir, open: RwLock::new(HashMap::new()) }
    }

    /// Opens `tenant`'s store if it is not open, bounded by `storage` bytes together
    /// with the `components` bytes beside it.
    ///
    /// # Errors
    ///
    /// The store cannot be opened (see [`Kv::open`]).
    pub(super) fn open(&self, tenant: &str, storage: u64, components: u64) -> anyhow::Result<()> {
        let mut open = self.open.write();
        if let Some((_, quota)) = open.get(tenant) {
            quota.max_bytes.store(storage, Ordering::Relaxed);
            quota.others.store(components, Ordering::Relaxed);
            return Ok(());
        }
        let quota = Arc::new(SharedQuota::new(
            format!("tenant `{tenant}`'s `storage` (its components and its key-value data)"),
            format!(
                "delete keys or components, or have the admin run `wasmproc tenant policy {tenant} --storage SIZE`"
            ),
            storage,
        ));
        quota.others.store(components, Ordering::Relaxed);
        let kv = Kv::open_sharing(&self.dir.join(tenant), KvSettings::default(), quota.clone())?;
        open.insert(tenant.to_owned(), (kv, quota));
        Ok(())
    }

    /// Sets `tenant`'s quota, if its store is open.
    pub(super) fn bound(&self, tenant: &str, storage: u64, components: u64) {
        if let Some((_, quota)) = self.open.read().get(tenant) {
            // Relaxed: see `SharedQuota`; the store reads each number on its own.
            quota.max_bytes.store(storage, Ordering::Relaxed);
            quota.others.store(components, Ordering::Relaxed);
        }
    }

    /// The bytes of keys and values in `tenant`'s store; 0 if it is not open.
    pub(super) fn used(&self, tenant: &str) -> u64 {
        self.open.read().get(tenant).map_or(0, |(_, quota)| quota.used.load(Ordering::Relaxed))
    }

    /// Closes `tenant`'s store and removes its data: the tenant is gone.
    ///
    /// # Errors
    ///
    /// The directory cannot be removed.
    pub(super) fn remove(&self, tenant: &str) -> anyhow::Result<()> {
        // Dropping the store stops its thread and closes it before its files go.
        drop(self.open.write().remove(tenant));
        let dir = self.dir.join(tenant);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(anyhow::anyhow!("cannot remove `{}`: {error}", dir.display())),
        }
    }

    fn store_of(&self, request: &Request<'_>) -> Option<Kv> {
        let (tenant, _) = request.kind()?.split_once('/')?;
        self.open.read().get(tenant).map(|(kv, _)| kv.clone())
    }
}

/// The family `kv` over the tenants' stores: see the module's docs.
pub(super) struct TenantKv(pub(super) Arc<Stores>);

impl Provider for TenantKv {
    fn family(&self) -> &str {
        "kv"
    }

    fn handle(&self, request: Request<'_>) {
        match self.0.store_of(&request) {
            Some(kv) => kv.handle(request),
            None => {
                let failure = Failure::new(
                    ErrorCode::Denied,
                    format!(
                        "`{}` needs the tenant's key-value store, which its policy does not allow: the admin allows \
                         it with `wasmproc tenant policy NAME --kv`",
                        request.name()
                    ),
                );
                request.complete(Err(failure.into()));
            }
        }
    }

    fn reads_only(&self, name: &str) -> bool {
        matches!(name, "kv.get" | "kv.list")
    }
}
