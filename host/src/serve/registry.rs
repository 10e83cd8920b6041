//! What the service keeps beside the journal, in one fjall database under `DATA/registry`:
//! tenants (by the hash of their token, with their policies), each tenant's components
//! and names for them, and each tenant's workflows. Every write is synced before it is answered.
//!
//! Keys are `TENANT \0 …`, so a tenant's records are one prefix and no lookup can reach
//! another tenant's. Values are JSON.
//!
//! # Grouped writes
//!
//! Workflow records written at once share one synced batch, as the journal's steps do
//! (group commit): a writer queues its records, and the first writer to find no batch
//! being committed takes everything queued, commits it, and hands each writer the
//! outcome. Those who queued meanwhile wait for the batch after it, which the first of
//! them to wake commits. So no write waits for a window, none is answered before its
//! batch is synced, and the syncs a second are bounded by the disk, not by the writers.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use parking_lot::{Condvar, Mutex};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::policy::{Grants, Limits, Policy};
use super::requests::RequestRecord;

/// A tenant: a name and the SHA-256 of its bearer token (the token itself is never kept).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tenant {
    /// Its name: what it is known by in the admin API and the data directory.
    pub name: String,
    /// The hex SHA-256 of its token.
    pub token_sha256: String,
    /// Its policy; the server's default when absent (a tenant added before policies).
    #[serde(default)]
    pub policy: Option<Policy>,
}

/// A component a tenant uploaded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ComponentRecord {
    /// `sha256:<hex>` of its bytes.
    pub hash: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its entry methods.
    pub entries: Vec<String>,
    /// The commands it declares it yields (the SDK's `uses!`), sorted; `None` when it
    /// declares nothing (which is not that it yields nothing).
    #[serde(default)]
    pub commands: Option<Vec<String>>,
    /// When it was uploaded, in milliseconds since the Unix epoch.
    pub uploaded_ms: u64,
}

/// Where a workflow is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Started and not ended (it may be waiting: a timer, a message, a child).
    Running,
    /// Ended normally, with a result.
    Completed,
    /// Ended otherwise: an error, a trap, a cancel that ended it, a termination.
    Failed,
}

impl State {
    /// `running`, `completed` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }
}

/// A workflow: one root process of the journal, started through the API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkflowRecord {
    /// Its id, unique within the tenant: the caller's, or drawn at random.
    pub id: String,
    /// The component's `sha256:<hex>`.
    pub component: String,
    /// The entry method.
    pub method: String,
    /// The input, as the caller gave it.
    pub input: Option<serde_json::Value>,
    /// The root process.
    pub pid: u64,
    /// Where it is in its life.
    pub state: State,
    /// When it was started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// When it ended.
    pub ended_ms: Option<u64>,
    /// Its result once ended: `{"ok": VALUE}` or `{"error": {"reason": NAME, "message": TEXT}}`.
    pub result: Option<serde_json::Value>,
    /// What it was granted beyond every workflow's defaults.
    #[serde(default)]
    pub grants: Grants,
    /// The limits its processes run under (the policy's memory when it asked for none).
    #[serde(default)]
    pub limits: Limits,
}

/// The service's records.
pub(super) struct Registry {
    db: Database,
    tenants: Keyspace,
    components: Keyspace,
    names: Keyspace,
    workflows: Keyspace,
    /// Requests to workflows, by `TENANT \0 WORKFLOW \0 REQUEST` (see `requests.rs`).
    requests: Keyspace,
    /// Workflow records waiting for a batch (see the module's docs).
    group: Mutex<Group>,
    /// Signalled when a batch is committed.
    committed: Condvar,
}

/// The writes queued for the next batch of workflow records.
#[derive(Default)]
struct Group {
    queued: Vec<Queued>,
    /// Whether a writer is committing a batch now.
    committing: bool,
}

/// One queued record: its key, its value, and where its batch's outcome is put.
struct Queued {
    key: Vec<u8>,
    value: Vec<u8>,
    outcome: Arc<OnceLock<Result<(), String>>>,
}

fn failed(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("the service's registry: {error}")
}

fn key(tenant: &str, rest: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(tenant.len() + 1 + rest.len());
    key.extend_from_slice(tenant.as_bytes());
    key.push(0);
    key.extend_from_slice(rest.as_bytes());
    key
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> anyhow::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| failed(format!("a damaged record: {e}")))
}

impl Registry {
    /// Opens (or creates) the registry in `dir`.
    ///
    /// # Errors
    ///
    /// Another host has it open, or it cannot be read.
    pub(super) fn open(dir: &Path) -> anyhow::Result<Registry> {
        let db = Database::builder(dir).open().map_err(|error| match error {
            fjall::Error::Locked => anyhow::anyhow!(
                "the data directory's registry ({}) is in use by another `wasmproc serve`; one server owns a data \
                 directory",
                dir.display()
            ),
            other => failed(other),
        })?;
        let keyspace = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default).map_err(failed);
        Ok(Registry {
            tenants: keyspace("tenants")?,
            components: keyspace("components")?,
            names: keyspace("names")?,
            workflows: keyspace("workflows")?,
            requests: keyspace("requests")?,
            db,
            group: Mutex::new(Group::default()),
            committed: Condvar::new(),
        })
    }

    fn put(&self, keyspace: &Keyspace, key: Vec<u8>, value: &impl Serialize) -> anyhow::Result<()> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        batch.insert(keyspace, key, serde_json::to_vec(value).map_err(failed)?);
        batch.commit().map_err(failed)
    }

    fn remove(&self, keyspace: &Keyspace, key: Vec<u8>) -> anyhow::Result<()> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        batch.remove(keyspace, key);
        batch.commit().map_err(failed)
    }

    fn get<T: DeserializeOwned>(&self, keyspace: &Keyspace, key: &[u8]) -> anyhow::Result<Option<T>> {
        keyspace.get(key).map_err(failed)?.map(|bytes| decode(&bytes)).transpose()
    }

    fn scan<T: DeserializeOwned>(&self, keyspace: &Keyspace, prefix: &[u8]) -> anyhow::Result<Vec<T>> {
        let mut found = Vec::new();
        for guard in keyspace.prefix(prefix) {
            let value = guard.value().map_err(failed)?;
            found.push(decode(&value)?);
        }
        Ok(found)
    }

    pub(super) fn tenants(&self) -> anyhow::Result<Vec<Tenant>> {
        self.scan(&self.tenants, b"")
    }

    pub(super) fn put_tenant(&self, tenant: &Tenant) -> anyhow::Result<()> {
        self.put(&self.tenants, tenant.name.as_bytes().to_vec(), tenant)
    }

    pub(super) fn remove_tenant(&self, name: &str) -> anyhow::Result<()> {
        self.remove(&self.tenants, name.as_bytes().to_vec())
    }

    pub(super) fn component(&self, tenant: &str, hash: &str) -> anyhow::Result<Option<ComponentRecord>> {
        self.get(&self.components, &key(tenant, hash))
    }

    pub(super) fn components(&self, tenant: &str) -> anyhow::Result<Vec<ComponentRecord>> {
        self.scan(&self.components, &key(tenant, ""))
    }

    pub(super) fn put_component(&self, tenant: &str, record: &ComponentRecord) -> anyhow::Result<()> {
        self.put(&self.components, key(tenant, &record.hash), record)
    }

    /// The hash a tenant's `name` (`NAME` or `NAME:TAG`) stands for.
    pub(super) fn name(&self, tenant: &str, name: &str) -> anyhow::Result<Option<String>> {
        self.get(&self.names, &key(tenant, name))
    }

    /// Every name of a tenant's, with the hash it stands for.
    pub(super) fn names(&self, tenant: &str) -> anyhow::Result<Vec<(String, String)>> {
        let prefix = key(tenant, "");
        let mut found = Vec::new();
        for guard in self.names.prefix(&prefix) {
            let (name, hash) = guard.into_inner().map_err(failed)?;
            found.push((String::from_utf8_lossy(&name[prefix.len()..]).into_owned(), decode(&hash)?));
        }
        Ok(found)
    }

    pub(super) fn put_name(&self, tenant: &str, name: &str, hash: &str) -> anyhow::Result<()> {
        self.put(&self.names, key(tenant, name), &hash)
    }

    /// Removes a tenant's component and every name of it, in one synced batch.
    pub(super) fn remove_component(&self, tenant: &str, hash: &str) -> anyhow::Result<()> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        batch.remove(&self.components, key(tenant, hash));
        for (name, named) in self.names(tenant)? {
            if named == hash {
                batch.remove(&self.names, key(tenant, &name));
            }
        }
        batch.commit().map_err(failed)
    }

    /// Whether any tenant has the component `hash`.
    pub(super) fn anyone_has(&self, hash: &str) -> anyhow::Result<bool> {
        for guard in self.components.iter() {
            let (key, _) = guard.into_inner().map_err(failed)?;
            if key.split(|b| *b == 0).nth(1) == Some(hash.as_bytes()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    pub(super) fn workflow(&self, tenant: &str, id: &str) -> anyhow::Result<Option<WorkflowRecord>> {
        self.get(&self.workflows, &key(tenant, id))
    }

    /// A tenant's workflows whose ids start with `prefix`, in id order.
    pub(super) fn workflows(&self, tenant: &str, prefix: &str) -> anyhow::Result<Vec<WorkflowRecord>> {
        self.scan(&self.workflows, &key(tenant, prefix))
    }

    /// Every tenant's workflows, with the tenant.
    pub(super) fn all_workflows(&self) -> anyhow::Result<Vec<(String, WorkflowRecord)>> {
        let mut found = Vec::new();
        for guard in self.workflows.iter() {
            let (key, value) = guard.into_inner().map_err(failed)?;
            let tenant = key.split(|b| *b == 0).next().unwrap_or_default();
            found.push((String::from_utf8_lossy(tenant).into_owned(), decode(&value)?));
        }
        Ok(found)
    }

    pub(super) fn put_workflow(&self, tenant: &str, record: &WorkflowRecord) -> anyhow::Result<()> {
        self.put_workflows(&[(tenant, record.clone())])
    }

    /// Puts every `(tenant, record)`, synced, in a batch shared with the other writers
    /// of the moment (see the module's docs); returns once it is synced.
    pub(super) fn put_workflows(&self, records: &[(&str, WorkflowRecord)]) -> anyhow::Result<()> {
        let outcome = Arc::new(OnceLock::new());
        let mut queued = Vec::with_capacity(records.len());
        for (tenant, record) in records {
            let value = serde_json::to_vec(record).map_err(failed)?;
            queued.push(Queued { key: key(tenant, &record.id), value, outcome: outcome.clone() });
        }
        let mut group = self.group.lock();
        group.queued.extend(queued);
        loop {
            if let Some(outcome) = outcome.get() {
                return outcome.clone().map_err(failed);
            }
            if group.committing {
                self.committed.wait(&mut group);
                continue;
            }
            group.committing = true;
            let batch = std::mem::take(&mut group.queued);
            let result = parking_lot::MutexGuard::unlocked(&mut group, || {
                let mut commit = self.db.batch().durability(Some(PersistMode::SyncData));
                for write in &batch {
                    commit.insert(&self.workflows, write.key.as_slice(), write.value.as_slice());
                }
                commit.commit().map_err(|e| e.to_string())
            });
            for write in batch {
                // Each writer's records share one outcome: the first set wins, and
                // every other is the same.
                let _ = write.outcome.set(result.clone());
            }
            group.committing = false;
            self.committed.notify_all();
        }
    }

    pub(super) fn remove_workflow(&self, tenant: &str, id: &str) -> anyhow::Result<()> {
        self.remove(&self.workflows, key(tenant, id))
    }

    /// Request `request` to `tenant`'s workflow `workflow`.
    pub(super) fn request(&self, tenant: &str, workflow: &str, request: &str) -> anyhow::Result<Option<RequestRecord>> {
        self.get(&self.requests, &key(tenant, &format!("{workflow}\0{request}")))
    }

    /// Every request to `tenant`'s workflow `workflow`, in id order.
    pub(super) fn requests(&self, tenant: &str, workflow: &str) -> anyhow::Result<Vec<RequestRecord>> {
        self.scan(&self.requests, &key(tenant, &format!("{workflow}\0")))
    }

    pub(super) fn put_request(&self, tenant: &str, workflow: &str, record: &RequestRecord) -> anyhow::Result<()> {
        self.put(&self.requests, key(tenant, &format!("{workflow}\0{}", record.id)), record)
    }

    /// Removes every request to `tenant`'s workflow `workflow`, in one synced batch.
    pub(super) fn remove_requests(&self, tenant: &str, workflow: &str) -> anyhow::Result<()> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        for guard in self.requests.prefix(key(tenant, &format!("{workflow}\0"))) {
            let (key, _) = guard.into_inner().map_err(failed)?;
            batch.remove(&self.requests, key);
        }
        batch.commit().map_err(failed)
    }
}
