//! The batches service: batches' records and what is derived from them
//! (their members' states, usage, cost and failures), and the decisions
//! about them that need no sandbox made or destroyed: whether a request is
//! well formed, and what spec an ended member is retried with. The
//! lifecycle (`control/batches.rs`) makes and destroys their sandboxes.
//! Members carry the `warren.dev/batch` label; status, usage and deletion
//! all go through that label, so a batch is never out of step with its
//! sandboxes.

use std::collections::BTreeMap;
use std::sync::Arc;

use warren_core::batch::{BatchCost, BatchFailure, BATCH_LABEL, MAX_BATCH, RETRY_LABEL};
use warren_core::clock::now_rfc3339;
use warren_core::fleet::Outcome;
use warren_core::labels::{self, Requirement};
use warren_core::profile::Policy;
use warren_core::state::reason;
use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, BatchInfo, BatchRequest, SandboxSpec, Selector, Usage};

use crate::store::{BatchRow, SandboxRow, Store};

pub struct Batches {
    store: Arc<dyn Store>,
    records: Arc<crate::records::Records>,
    nodes: Arc<crate::nodes::Nodes>,
    /// How a member's memory grows when it is retried without a profile.
    policy: Policy,
}

impl Batches {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        records: Arc<crate::records::Records>,
        nodes: Arc<crate::nodes::Nodes>,
        policy: Policy,
    ) -> Batches {
        Batches {
            store,
            records,
            nodes,
            policy,
        }
    }

    /// What a batch request may not carry, refused before anything else.
    pub(crate) fn check(req: &BatchRequest) -> Result<(), ApiError> {
        if req.count == 0 || req.count > MAX_BATCH {
            return Err(ApiError::bad_request(format!(
                "count must be between 1 and {MAX_BATCH}"
            )));
        }
        labels::validate(&req.labels).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if req.labels.contains_key(BATCH_LABEL) || req.spec.labels.contains_key(BATCH_LABEL) {
            return Err(ApiError::bad_request(format!(
                "the label {BATCH_LABEL} is set by Warren"
            )));
        }
        if req.spec.name.is_some() {
            return Err(ApiError::bad_request(
                "name is one sandbox's; a batch's members are told apart by their batch label",
            ));
        }
        if req.spec.request_id.is_some() {
            return Err(ApiError::bad_request(
                "request_id is per sandbox; leave it out of a batch spec",
            ));
        }
        Ok(())
    }

    pub(crate) async fn insert(&self, row: &BatchRow) -> Result<(), ApiError> {
        Ok(self.store.insert_batch(row).await?)
    }

    /// Whether the batch was deleted (its filling stops).
    pub(crate) async fn deleted(&self, id: &str) -> bool {
        matches!(self.store.batches(Some(id)).await.as_deref(), Ok([b]) if b.deleted_at.is_some())
    }

    /// Marks the batch deleted; its tenant, for removing its members.
    pub(crate) async fn mark_deleted(&self, id: &str) -> Result<TenantName, ApiError> {
        let tenant = self.info(id).await?.tenant;
        self.store.delete_batch(id, &now_rfc3339()).await?;
        Ok(tenant)
    }

    /// The label selector of the batch's members.
    pub(crate) fn selector(id: &str) -> Selector {
        Selector(vec![Requirement::Equals(BATCH_LABEL.into(), id.into())])
    }

    /// The spec each member is made with: the batch's, its labels and the
    /// batch label added.
    pub(crate) fn member_spec(batch: &BatchRow) -> SandboxSpec {
        let mut spec = batch.spec.clone();
        spec.labels.extend(batch.labels.clone());
        spec.labels.insert(BATCH_LABEL.into(), batch.id.clone());
        spec
    }

    pub async fn info(&self, id: &str) -> Result<BatchInfo, ApiError> {
        let batch = self.store.batches(Some(id)).await?.pop().ok_or_else(|| {
            ApiError::not_found(format!(
                "no batch with id {id:?}; list them with `warren batch ls`"
            ))
        })?;
        // The records themselves: an ended member's carries its usage.
        let selector = Self::selector(id);
        let members: Vec<crate::store::SandboxRow> = self
            .records
            .rows_owned(Some(&batch.tenant), &[])
            .await?
            .into_iter()
            .filter(|r| selector.matches(r.labels()))
            .collect();
        let mut states = BTreeMap::new();
        let mut usage = Usage::default();
        let mut failures = Vec::new();
        let (mut succeeded, mut cost) = (0, BatchCost::default());
        for m in &members {
            *states.entry(m.state.as_str().to_string()).or_insert(0) += 1;
            // Read now (as `inspect` does): a sandbox created a moment ago
            // has no periodic sample yet.
            // An ended member's usage as it ended: the batch's sums last
            // after its sandboxes are gone.
            let status = match (m.state.is_live(), self.nodes.reachable(&m.node)) {
                (true, Some(node)) => node.status(&m.id, true).await.ok(),
                _ => None,
            };
            let member = match &status {
                Some(s) => s.usage.clone(),
                None if !m.state.is_live() => m.usage.clone(),
                None => None,
            };
            if let Some(u) = &member {
                usage.cpu_usage_ns += u.cpu_usage_ns;
                if m.state.is_live() {
                    usage.memory_bytes += u.memory_bytes;
                    usage.pids += u.pids;
                }
                usage.memory_peak_bytes += u.memory_peak_bytes;
                usage.oom_kills += u.oom_kills;
                usage.runtime_ms += u.runtime_ms;
                usage.memory_byte_seconds += u.memory_byte_seconds;
                cost.add(u, m.resources.gpus);
            }
            // The fleet's rule (`Outcome`): a kept member OOM-killed has
            // failed already.
            let failed = Outcome::judge(m.state, &m.reason, m.exit_code).is_failure();
            if failed {
                failures.push(BatchFailure {
                    sandbox_id: m.id.clone(),
                    state: m.state,
                    reason: m.reason.clone(),
                    exit_code: m.exit_code,
                });
            } else if m.state.is_final() {
                succeeded += 1;
            }
        }
        Ok(BatchInfo {
            id: batch.id,
            count: batch.count,
            labels: batch.labels,
            spec: batch.spec,
            created_at: batch.created_at,
            deleted_at: batch.deleted_at,
            retry_on_oom: batch.retry_on_oom,
            retry_on_lost: batch.retry_on_lost,
            submitted: members.len() as u32,
            states,
            usage,
            failures,
            succeeded,
            cost,
            tenant: batch.tenant,
        })
    }

    /// A batch member that ended for `why` is created once more when its
    /// batch asks for it: OOM-killed (`retry_on_oom`), with the grown
    /// request of its profile (or, with no profile, its memory grown as the
    /// profile policy grows one, `grow_by`, at most `max_growth` times the
    /// batch's request); lost with its node (`retry_on_lost`), as it was,
    /// wherever there is room. The tenant and spec to create it with, or
    /// None.
    pub(crate) async fn retry_of(
        &self,
        row: &SandboxRow,
        why: &str,
    ) -> Option<(TenantName, SandboxSpec)> {
        let oom = why == reason::OOM_KILLED;
        if !(oom || why == reason::NODE_LOST) || row.spec.labels.contains_key(RETRY_LABEL) {
            return None;
        }
        let bid = row.spec.labels.get(BATCH_LABEL)?;
        let batch = self.store.batches(Some(bid)).await.ok()?.pop()?;
        let asked = if oom {
            batch.retry_on_oom
        } else {
            batch.retry_on_lost
        };
        if !asked || batch.deleted_at.is_some() {
            return None;
        }
        let mut spec = row.spec.clone();
        spec.labels.insert(RETRY_LABEL.into(), row.id.clone());
        let has_profile = match crate::profiles::profile_name(&batch.tenant, &spec) {
            Some(name) => matches!(self.store.profile(&name).await, Ok(Some(_))),
            None => false,
        };
        if !oom {
            // As it was.
        } else if has_profile {
            spec.cpu = None;
            spec.memory = None;
        } else {
            let grown = (row.resources.memory as f64 * self.policy.grow_by) as u64;
            let asked = batch.spec.memory.map_or(row.resources.memory, |m| m.0);
            let cap = (asked as f64 * self.policy.max_growth) as u64;
            spec.memory = Some(warren_core::spec::ByteSize(grown.min(cap)));
        }
        Some((batch.tenant, spec))
    }

    /// The batches `who` reaches.
    pub async fn list(&self, who: &Principal) -> Result<Vec<BatchInfo>, ApiError> {
        let mut out = Vec::new();
        for b in self.store.batches(None).await? {
            if !who.reaches(&b.tenant) {
                continue;
            }
            out.push(self.info(&b.id).await?);
        }
        Ok(out)
    }
}
