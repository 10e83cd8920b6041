//! What the console (`/ui`) shows beside the workflows themselves, as the API answers
//! it: a tenant's workflows counted by state, and the host's figures (the ones
//! `/metrics` exposes, read the same way, as JSON).

use std::time::{Duration, Instant};

use super::registry::{MOST_EXAMINED, State};
use super::wire::{HostFigures, WorkerFigures, WorkflowCounts};
use super::{Refusal, Service, now_ms};

/// Which of a tenant's workflows [`Service::counts`] counts.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CountFilter {
    /// Only those of this component (a hash or a name).
    pub component: Option<String>,
    /// Only those whose id starts with this.
    pub prefix: Option<String>,
    /// Only those started at or after this time, in milliseconds since the Unix epoch.
    pub started_after: Option<u64>,
    /// Only those started before this time, in milliseconds since the Unix epoch.
    pub started_before: Option<u64>,
}

impl Service {
    /// Tenant `tenant`'s workflows that `filter` selects, counted by state.
    ///
    /// Without a filter, from the counts the registry keeps (see `registry.rs`) and the
    /// ends not yet recorded: exact. With one, by reading the workflows it selects, at
    /// most 10,000 (`MOST_EXAMINED`) of them: the counts of those read, not `exact` when there
    /// were more.
    ///
    /// # Errors
    ///
    /// The registry cannot be read.
    pub fn counts(&self, tenant: &str, filter: &CountFilter) -> Result<WorkflowCounts, Refusal> {
        let filtered = filter.component.is_some()
            || filter.prefix.is_some()
            || filter.started_after.is_some()
            || filter.started_before.is_some();
        if !filtered {
            return Ok(self.kept_counts(tenant));
        }
        let component = match &filter.component {
            Some(reference) => Some(self.inner.code.find(tenant, reference)?.unwrap_or_default()),
            None => None,
        };
        let prefix = filter.prefix.as_deref().unwrap_or("");
        let mut counts = WorkflowCounts { running: 0, completed: 0, failed: 0, exact: true };
        let scanned = self.inner.registry.scan_workflows(tenant, prefix, None, usize::MAX, MOST_EXAMINED, |w| {
            if component.as_deref().is_none_or(|hash| w.component == hash)
                && filter.started_after.is_none_or(|after| w.started_ms >= after)
                && filter.started_before.is_none_or(|before| w.started_ms < before)
            {
                self.now(tenant, w)?;
                *match w.state {
                    State::Running => &mut counts.running,
                    State::Completed => &mut counts.completed,
                    State::Failed => &mut counts.failed,
                } += 1;
            }
            Ok(false)
        })?;
        counts.exact = scanned.next.is_none();
        Ok(counts)
    }

    /// The counts of all `tenant`'s workflows, from the registry's counts and the ends
    /// not yet in them (see [`Unrecorded`](super::Unrecorded)).
    fn kept_counts(&self, tenant: &str) -> WorkflowCounts {
        let inner = &self.inner;
        let mut unrecorded = inner.unrecorded.lock();
        // A settle writes a batch of ends and takes them out of `unrecorded`: the time
        // of one write. Past this, the counts are answered as they are, said inexact.
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut exact = true;
        while unrecorded.settling > 0 {
            if inner.recorded.wait_until(&mut unrecorded, deadline).timed_out() {
                exact = false;
                break;
            }
        }
        let recorded = inner.registry.counts(tenant);
        let [completed, failed] = unrecorded.ends.get(tenant).copied().unwrap_or_default();
        WorkflowCounts {
            running: recorded.of(State::Running).saturating_sub(completed + failed),
            completed: recorded.of(State::Completed) + completed,
            failed: recorded.of(State::Failed) + failed,
            exact,
        }
    }

    /// The host's figures now, and how many of `tenant`'s workflows run.
    pub fn host_figures(&self, tenant: &str) -> HostFigures {
        let stats = self.inner.handle.stats();
        let journal = self.inner.handle.journal_stats();
        let running = self.inner.live.lock().running_of(tenant);
        HostFigures {
            at_ms: now_ms(),
            workers: stats.workers.iter().map(|w| WorkerFigures { steps: w.executed }).collect(),
            steps: stats.workers.iter().map(|w| w.executed).sum(),
            queued: stats.global_queue as u64,
            live: stats.live as u64,
            peak_live: stats.peak_live as u64,
            spawned: stats.spawned,
            ended: stats.completed,
            messages: stats.messages,
            hibernated: stats.hibernated,
            suspended: stats.suspended as u64,
            commits: journal.as_ref().map(|j| j.commits),
            journal_records: journal.as_ref().map(|j| j.records),
            journal_bytes: journal.as_ref().map(|j| j.bytes),
            running: running as u64,
        }
    }
}
