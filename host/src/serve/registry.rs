//! What the service keeps beside the journal, in one fjall database under `DATA/registry`:
//! tenants (by the hash of their token, with their policies), each tenant's components
//! and names for them, and each tenant's workflows. Every write is synced before it is
//! answered, but a workflow's start and end, which the journal holds
//! ([`Registry::put_journaled`]).
//!
//! Keys are `TENANT \0 …`, so a tenant's records are one prefix and no lookup can reach
//! another tenant's. Values are JSON.
//!
//! # Counts by state
//!
//! The keyspace `counts` holds how many workflows each tenant has in each state, under
//! `TENANT \0 STATE`, so that counting reads three keys, not every record. Every write
//! of workflow records puts the counts it changes in the same batch, which fjall commits
//! atomically: whatever a crash keeps of the records, it keeps the counts of them.
//! Writers of workflow records take turns (`writes`), each reading the states its
//! records replace and the counts as the last writer left them. A registry from before
//! the counts (no `\0counted` key) is counted once when opened.
//!
//! # Grouped writes
//!
//! Workflow records written at once share one synced batch, as the journal's steps do
//! (group commit): a writer queues its records, and the first writer to find no batch
//! being committed takes everything queued, commits it, and hands each writer the
//! outcome. Those who queued meanwhile wait for the batch after it, which one of them,
//! woken alone, commits. So no write waits for a window, none is answered before its
//! batch is synced, and the syncs a second are bounded by the disk, not by the writers.
//!
//! Writers wait on one of two condition variables by the parity of their batch's number:
//! a committed batch wakes its own writers, all of whom are done, and one writer of the
//! next, to commit it; the others of the next sleep on. Only those two batches can have
//! writers waiting: a writer queues into the batch being filled, which is committed only
//! once the batch before it is.

use std::collections::HashMap;
use std::ops::Bound;
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

/// A workflow record's state alone: what counting its replacement needs, read without
/// building the rest of the record.
#[derive(Deserialize)]
struct StateOf {
    state: State,
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
    /// Every state, in the order of `Counts`' fields.
    pub(super) const ALL: [State; 3] = [State::Running, State::Completed, State::Failed];

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

/// How many workflows are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts([u64; 3]);

impl Counts {
    pub(super) fn of(&self, state: State) -> u64 {
        self.0[state as usize]
    }

    fn add(&mut self, state: State, by: i64) {
        let count = &mut self.0[state as usize];
        *count = count.saturating_add_signed(by);
    }
}

/// The most workflow records one listing or count reads before it answers: a bound on
/// what one request costs, whatever its filter selects (about 10 ms of reading and
/// decoding in a debug build; picked to keep a request well under what a page's user
/// notices, tune with data). A listing cut short by it says so and where to go on from.
pub(super) const MOST_EXAMINED: usize = 10_000;

/// A range of a tenant's workflows, read by [`Registry::scan_workflows`].
pub(super) struct Scanned {
    /// Those the filter kept, in id order.
    pub(super) found: Vec<WorkflowRecord>,
    /// How many records were read.
    pub(super) examined: usize,
    /// The id of the last record read, when more of the range follows it.
    pub(super) next: Option<String>,
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
    /// Each tenant's workflows counted by state (see the module's docs).
    counts: Keyspace,
    /// Held by a writer of workflow records from reading what its records replace until
    /// its batch is committed and `counted` has its counts.
    writes: Mutex<()>,
    /// The counts as the last committed batch left them.
    counted: Mutex<HashMap<String, Counts>>,
    /// Workflow records waiting for a batch (see the module's docs).
    group: Mutex<Group>,
    /// Signalled when a batch is committed: `committed[n % 2]` for batch `n`'s writers.
    committed: [Condvar; 2],
}

/// The writes queued for the next batch of workflow records.
#[derive(Default)]
struct Group {
    queued: Vec<Queued>,
    /// Whether a writer is committing a batch now.
    committing: bool,
    /// The number of the batch `queued` fills.
    filling: u64,
}

/// One queued record: its key, its value, and where its batch's outcome is put.
struct Queued {
    tenant: String,
    id: String,
    state: State,
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

/// The key `counts` has for `tenant`'s workflows in `state`.
fn count_key(tenant: &str, state: State) -> Vec<u8> {
    key(tenant, state.as_str())
}

/// Marks a registry whose `counts` are kept (see the module's docs); no tenant's name
/// starts with a zero byte.
const COUNTED: &[u8] = b"\0counted";

/// The first key after every key that starts with `prefix`, if there is one.
fn after_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
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
        let registry = Registry {
            tenants: keyspace("tenants")?,
            components: keyspace("components")?,
            names: keyspace("names")?,
            workflows: keyspace("workflows")?,
            requests: keyspace("requests")?,
            counts: keyspace("counts")?,
            db,
            group: Mutex::new(Group::default()),
            committed: [Condvar::new(), Condvar::new()],
            writes: Mutex::new(()),
            counted: Mutex::new(HashMap::new()),
        };
        *registry.counted.lock() = registry.read_counts()?;
        Ok(registry)
    }

    /// The counts `counts` holds; made from every record first if it holds none yet.
    fn read_counts(&self) -> anyhow::Result<HashMap<String, Counts>> {
        let mut counted: HashMap<String, Counts> = HashMap::new();
        if self.counts.contains_key(COUNTED).map_err(failed)? {
            for guard in self.counts.iter() {
                let (key, value) = guard.into_inner().map_err(failed)?;
                let mut parts = key.splitn(2, |b| *b == 0);
                let (Some(tenant), Some(state)) = (parts.next(), parts.next()) else { continue };
                let Some(state) = State::ALL.into_iter().find(|s| s.as_str().as_bytes() == state) else { continue };
                let count: u64 = decode(&value)?;
                counted.entry(String::from_utf8_lossy(tenant).into_owned()).or_default().add(state, count as i64);
            }
            return Ok(counted);
        }
        for (tenant, record) in self.all_workflows()? {
            counted.entry(tenant).or_default().add(record.state, 1);
        }
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        for (tenant, counts) in &counted {
            for state in State::ALL {
                batch.insert(
                    &self.counts,
                    count_key(tenant, state),
                    serde_json::to_vec(&counts.of(state)).map_err(failed)?,
                );
            }
        }
        batch.insert(&self.counts, COUNTED, b"1");
        batch.commit().map_err(failed)?;
        Ok(counted)
    }

    /// `tenant`'s workflows counted by state, as the registry's records have them.
    pub(super) fn counts(&self, tenant: &str) -> Counts {
        self.counted.lock().get(tenant).copied().unwrap_or_default()
    }

    /// Commits `batch` with writes of workflow records, each `(tenant, id, state)` (a
    /// state for a record put, `None` for one removed), and with the counts they change;
    /// returns once it is committed and the counts kept in memory are the new ones.
    fn commit_workflows(
        &self,
        mut batch: fjall::OwnedWriteBatch,
        writes: &[(&str, &str, Option<State>)],
    ) -> anyhow::Result<()> {
        let _turn = self.writes.lock();
        // What each record replaces: the last write of its key in this batch, else what
        // the registry holds.
        let mut replaced: HashMap<(&str, &str), Option<State>> = HashMap::new();
        let mut deltas: HashMap<&str, [i64; 3]> = HashMap::new();
        for &(tenant, id, state) in writes {
            let before = match replaced.get(&(tenant, id)) {
                Some(before) => *before,
                None => self.get::<StateOf>(&self.workflows, &key(tenant, id))?.map(|w| w.state),
            };
            replaced.insert((tenant, id), state);
            let delta = deltas.entry(tenant).or_default();
            if let Some(before) = before {
                delta[before as usize] -= 1;
            }
            if let Some(after) = state {
                delta[after as usize] += 1;
            }
        }
        let mut counts: Vec<(&str, Counts)> = Vec::with_capacity(deltas.len());
        {
            let counted = self.counted.lock();
            for (tenant, delta) in &deltas {
                let mut now = counted.get(*tenant).copied().unwrap_or_default();
                for state in State::ALL {
                    if delta[state as usize] != 0 {
                        now.add(state, delta[state as usize]);
                        let count = serde_json::to_vec(&now.of(state)).map_err(failed)?;
                        batch.insert(&self.counts, count_key(tenant, state), count);
                    }
                }
                counts.push((tenant, now));
            }
        }
        batch.commit().map_err(failed)?;
        let mut counted = self.counted.lock();
        for (tenant, now) in counts {
            counted.insert(tenant.to_owned(), now);
        }
        Ok(())
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

    /// Whether `tenant` has the component `hash`, without reading its record.
    pub(super) fn has_component(&self, tenant: &str, hash: &str) -> anyhow::Result<bool> {
        self.components.contains_key(key(tenant, hash)).map_err(failed)
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

    /// A tenant's workflows whose ids start with `prefix` and come after `after`, in id
    /// order, as `keep` keeps them (it may change a record it keeps): reads until `limit`
    /// are kept, `most` are read or the range ends, whichever comes first.
    pub(super) fn scan_workflows(
        &self,
        tenant: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        most: usize,
        mut keep: impl FnMut(&mut WorkflowRecord) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Scanned> {
        let first = key(tenant, prefix);
        let start = match after.map(|after| key(tenant, after)) {
            Some(after) if after >= first => Bound::Excluded(after),
            _ => Bound::Included(first.clone()),
        };
        let end = after_prefix(&first).map_or(Bound::Unbounded, Bound::Excluded);
        let mut scanned = Scanned { found: Vec::new(), examined: 0, next: None };
        let mut last = None;
        for guard in self.workflows.range((start, end)) {
            if scanned.found.len() >= limit || scanned.examined >= most {
                scanned.next = last;
                break;
            }
            let value = guard.value().map_err(failed)?;
            let mut record: WorkflowRecord = decode(&value)?;
            scanned.examined += 1;
            last = Some(record.id.clone());
            if keep(&mut record)? {
                scanned.found.push(record);
            }
        }
        Ok(scanned)
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

    #[cfg(test)]
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
            queued.push(Queued {
                tenant: (*tenant).to_owned(),
                id: record.id.clone(),
                state: record.state,
                key: key(tenant, &record.id),
                value,
                outcome: outcome.clone(),
            });
        }
        let mut group = self.group.lock();
        group.queued.extend(queued);
        let ours = group.filling;
        loop {
            if let Some(outcome) = outcome.get() {
                return outcome.clone().map_err(failed);
            }
            if group.committing {
                self.committed[(ours % 2) as usize].wait(&mut group);
                continue;
            }
            // Not committing, our outcome not set: `queued` holds our records, and its
            // batch is ours.
            group.committing = true;
            group.filling += 1;
            let batch = std::mem::take(&mut group.queued);
            let result = parking_lot::MutexGuard::unlocked(&mut group, || {
                let mut commit = self.db.batch().durability(Some(PersistMode::SyncData));
                for write in &batch {
                    commit.insert(&self.workflows, write.key.as_slice(), write.value.as_slice());
                }
                let writes: Vec<_> = batch.iter().map(|w| (w.tenant.as_str(), w.id.as_str(), Some(w.state))).collect();
                self.commit_workflows(commit, &writes).map_err(|e| format!("{e:#}"))
            });
            for write in batch {
                // Each writer's records share one outcome: the first set wins, and
                // every other is the same.
                let _ = write.outcome.set(result.clone());
            }
            group.committing = false;
            self.committed[(ours % 2) as usize].notify_all();
            self.committed[((ours + 1) % 2) as usize].notify_one();
        }
    }

    /// Puts every `(tenant, record)` in one batch handed to the operating system and not
    /// synced: for what the journal holds durably (a workflow's start, in its root's
    /// spawn note, once its record is committed; its end), so that writing it costs no
    /// sync of the disk. A crash of the host keeps it; one of the machine may lose what
    /// no later synced write carried, which the next server makes again from the
    /// journal (`noted.rs`, `Service::reattach`).
    pub(super) fn put_journaled(&self, records: &[(&str, WorkflowRecord)]) -> anyhow::Result<()> {
        let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
        for (tenant, record) in records {
            batch.insert(&self.workflows, key(tenant, &record.id), serde_json::to_vec(record).map_err(failed)?);
        }
        let writes: Vec<_> = records.iter().map(|(tenant, w)| (*tenant, w.id.as_str(), Some(w.state))).collect();
        self.commit_workflows(batch, &writes)
    }

    pub(super) fn remove_workflow(&self, tenant: &str, id: &str) -> anyhow::Result<()> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        batch.remove(&self.workflows, key(tenant, id));
        self.commit_workflows(batch, &[(tenant, id, None)])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, state: State) -> WorkflowRecord {
        WorkflowRecord {
            id: id.to_owned(),
            component: "sha256:00".to_owned(),
            method: "main".to_owned(),
            input: None,
            pid: 1,
            state,
            started_ms: 0,
            ended_ms: None,
            result: None,
            grants: Grants::default(),
            limits: Limits::default(),
        }
    }

    fn counts(registry: &Registry, tenant: &str) -> [u64; 3] {
        State::ALL.map(|state| registry.counts(tenant).of(state))
    }

    /// The counts follow every write of a record, each tenant its own, are read back
    /// as written when the registry opens again, and are made from the records when it
    /// opens a registry that has none.
    #[test]
    fn the_counts_by_state_follow_every_write_and_are_made_for_a_registry_without_them() {
        let dir = std::env::temp_dir().join(format!("wasmproc-registry-{}-counts", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let registry = Registry::open(&dir).expect("it opens");
        let running: Vec<_> = (0..5).map(|i| ("acme", record(&format!("w{i}"), State::Running))).collect();
        registry.put_workflows(&running).expect("written");
        registry.put_workflow("globex", &record("w0", State::Running)).expect("written");
        assert_eq!(counts(&registry, "acme"), [5, 0, 0]);
        // An end, the same end twice in one batch, a failure, a removal.
        let ends = [
            ("acme", record("w0", State::Completed)),
            ("acme", record("w1", State::Completed)),
            ("acme", record("w1", State::Completed)),
            ("acme", record("w2", State::Failed)),
        ];
        registry.put_journaled(&ends).expect("written");
        registry.remove_workflow("acme", "w3").expect("removed");
        registry.remove_workflow("acme", "nothing").expect("nothing removed");
        assert_eq!((counts(&registry, "acme"), counts(&registry, "globex")), ([1, 2, 1], [1, 0, 0]));
        drop(registry);

        let registry = Registry::open(&dir).expect("it opens again");
        assert_eq!((counts(&registry, "acme"), counts(&registry, "globex")), ([1, 2, 1], [1, 0, 0]));
        // A registry from before the counts: its records, and no counts.
        let mut batch = registry.db.batch().durability(Some(PersistMode::SyncData));
        for guard in registry.counts.iter() {
            batch.remove(&registry.counts, guard.key().expect("a key"));
        }
        batch.commit().expect("the counts are gone");
        drop(registry);
        let registry = Registry::open(&dir).expect("it opens again");
        assert_eq!((counts(&registry, "acme"), counts(&registry, "globex")), ([1, 2, 1], [1, 0, 0]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Writers at once share batches: every one returns (none is left waiting for a
    /// batch no one commits) with its record written, and the counts hold them all.
    #[test]
    fn writers_at_once_all_return_with_their_records_written() {
        let dir = std::env::temp_dir().join(format!("wasmproc-registry-{}-writers", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let registry = Registry::open(&dir).expect("it opens");
        let (writers, each) = (8, 40);
        std::thread::scope(|scope| {
            for writer in 0..writers {
                let registry = &registry;
                scope.spawn(move || {
                    for i in 0..each {
                        let id = format!("w{writer}-{i}");
                        registry.put_workflow("acme", &record(&id, State::Running)).expect("written");
                        assert!(registry.workflow("acme", &id).expect("read").is_some(), "`{id}` is written");
                    }
                });
            }
        });
        assert_eq!(counts(&registry, "acme"), [writers * each, 0, 0]);
        assert_eq!(registry.all_workflows().expect("read").len() as u64, writers * each);
        drop(registry);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
